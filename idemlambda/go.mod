module github.com/seed-a1b882c0/idem/idemlambda

go 1.26.0

require (
	github.com/aws/aws-lambda-go v1.55.1
	github.com/jmespath-community/go-jmespath v1.1.1
	github.com/seed-a1b882c0/idem v0.1.0
	github.com/seed-a1b882c0/idem/store/redisstore v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/exp v0.0.0-20230314191032-db074128a8ec // indirect
	golang.org/x/sys v0.48.0 // indirect
)
