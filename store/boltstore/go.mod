module github.com/seed-a1b882c0/idem/store/boltstore

go 1.26.0

require (
	github.com/seed-a1b882c0/idem v0.1.0
	go.etcd.io/bbolt v1.4.3
	go.uber.org/goleak v1.3.0
)

require (
	github.com/anishathalye/porcupine v1.3.1 // indirect
	golang.org/x/sys v0.29.0 // indirect
)
