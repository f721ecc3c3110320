module github.com/seed-a1b882c0/idem/idemlambda

go 1.26

require github.com/seed-a1b882c0/idem v0.0.0

require (
	github.com/aws/aws-lambda-go v1.55.1 // indirect
	github.com/jmespath-community/go-jmespath v1.1.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/exp v0.0.0-20230314191032-db074128a8ec // indirect
)

replace github.com/seed-a1b882c0/idem => ..
