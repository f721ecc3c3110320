package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = ` 03:10:00 up 1 min,  0 user,  load average: 1.00, 1.00, 1.00
pkg: github.com/seed-a1b882c0/idem/idemnats
cpu: AMD EPYC
BenchmarkConsume/bare/c=16-2   	    5000	    100 ns/op	        8.000 broker-cpu-µs/msg	        5.000 client-cpu-µs/msg	    100000 msgs/s	         0.1000 redis-cpu-µs/msg
BenchmarkConsume/redis/c=16-2   	    5000	    100 ns/op	        40.00 broker-cpu-µs/msg	        100.0 client-cpu-µs/msg	      8000 msgs/s	        50.00 redis-cpu-µs/msg
BenchmarkConsumeBatch/redis/c=16-2   	    5000	    100 ns/op	        30.00 broker-cpu-µs/msg	        60.00 client-cpu-µs/msg	        16.00 msgs/batch	     12000 msgs/s	        30.00 redis-cpu-µs/msg
BenchmarkConsumeBatch/redis/c=16-2   	    5000	    100 ns/op	        30.00 broker-cpu-µs/msg	        40.00 client-cpu-µs/msg	        16.00 msgs/batch	     10000 msgs/s	        20.00 redis-cpu-µs/msg
BenchmarkConsumeBatch/redis/c=16-2   	    5000	    100 ns/op	        30.00 broker-cpu-µs/msg	        50.00 client-cpu-µs/msg	        16.00 msgs/batch	     11000 msgs/s	        25.00 redis-cpu-µs/msg
BenchmarkConsumeHandDedup/redis/c=16-2   	    5000	    100 ns/op	        20.00 broker-cpu-µs/msg	        20.00 client-cpu-µs/msg	        16.00 msgs/batch	     22000 msgs/s	        10.00 redis-cpu-µs/msg
pkg: github.com/seed-a1b882c0/idem/idemkafka
BenchmarkConsume/bare-2         	    5000	    100 ns/op	         2.500 client-cpu-µs/msg	    400000 msgs/s	         0.1000 redis-cpu-µs/msg
BenchmarkConsume/idemkafka+redis-2         	    5000	    100 ns/op	         80.00 client-cpu-µs/msg	    8000 msgs/s	         60.00 redis-cpu-µs/msg
BenchmarkConsumeHandDedup/redis-2         	    5000	    100 ns/op	         10.00 client-cpu-µs/msg	    32000 msgs/s	         12.00 redis-cpu-µs/msg
pkg: github.com/seed-a1b882c0/idem/idemkafka
BenchmarkConsume/idemkafka+postgres-2         	    1000	    100 ns/op	         400.0 client-cpu-µs/msg	    200.0 msgs/s
 03:11:00 up 2 min,  0 user,  load average: 1.50, 1.00, 1.00
`

// The table against the hand-written dedup: per broker, bare, hand-written,
// single and batch paths (medians), the batch path's ratios to the
// hand-written dedup, and idemkafka's other stores; a group the run lacks
// is left out.
func TestHandTable(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "consumers.txt")
	if err := os.WriteFile(f, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	rows, _, err := table(f)
	if err != nil {
		t.Fatal(err)
	}
	got := handTable(rows)
	for _, want := range []string{
		"| NATS JetStream | 16 | bare (no dedup) | 100000 | 5.0 | 0.1 | 8.0 | — | — | — |\n",
		"| NATS JetStream | 16 | hand-written dedup | 22000 | 20.0 | 10.0 | 20.0 | — | — | — |\n",
		"| NATS JetStream | 16 | idem single path | 8000 | 100.0 | 50.0 | 40.0 | — | — | — |\n",
		// Medians of the three runs: 11000 msgs/s, 25 µs Redis, 50 µs client.
		"| NATS JetStream | 16 | idem batch path | 11000 | 50.0 | 25.0 | 30.0 | 0.50 | 2.50 | 2.50 |\n",
		"| Kafka (kfake) | poll of 100 | idem batch path | 8000 | 80.0 | 60.0 | — | 0.25 | 5.00 | 8.00 |\n",
		"| Kafka (kfake) | poll of 100 | idem batch path, PostgreSQL | 200 | 400.0 | — | — | — | — | — |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the table lacks the row\n%s\ngot:\n%s", want, got)
		}
	}
	for _, absent := range []string{"RabbitMQ", "| NATS JetStream | 32 |", "idem single path | — |", "DynamoDB"} {
		if strings.Contains(got, absent) {
			t.Errorf("the table has %q, which the run did not measure:\n%s", absent, got)
		}
	}
	if handTable(rows[:3]) != "" {
		t.Error("a run without a hand-written dedup has a table against it")
	}
}
