module github.com/seed-a1b882c0/idem/idemamqp

go 1.26.0

require (
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/seed-a1b882c0/idem v0.1.0
	github.com/seed-a1b882c0/idem/store/redisstore v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
