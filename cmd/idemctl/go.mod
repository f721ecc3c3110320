module github.com/seed-a1b882c0/idem/cmd/idemctl

go 1.26.0

require (
	github.com/prometheus/client_golang v1.25.0
	github.com/seed-a1b882c0/idem v0.1.0
	github.com/seed-a1b882c0/idem/store/storeurl v0.1.0
	go.uber.org/goleak v1.3.0
)
