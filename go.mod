module github.com/seed-a1b882c0/idem

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	go.uber.org/goleak v1.3.0
)
