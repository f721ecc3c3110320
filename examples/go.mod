module github.com/seed-a1b882c0/idem/examples

go 1.25.0

require (
	github.com/seed-a1b882c0/idem v0.0.0
	github.com/seed-a1b882c0/idem/store/boltstore v0.0.0
)

require (
	go.etcd.io/bbolt v1.4.3 // indirect
	golang.org/x/sys v0.29.0 // indirect
)

replace (
	github.com/seed-a1b882c0/idem => ../
	github.com/seed-a1b882c0/idem/store/boltstore => ../store/boltstore
)
