module github.com/seed-a1b882c0/idem/examples

go 1.25.0

require github.com/seed-a1b882c0/idem v0.0.0

replace github.com/seed-a1b882c0/idem => ../
