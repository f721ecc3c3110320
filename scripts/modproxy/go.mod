module github.com/seed-a1b882c0/idem/scripts/modproxy

go 1.26.0

require golang.org/x/mod v0.41.0
