// Package baseline names the benchmarks that compare idem's consumers with
// the dedup a team writes by hand (BenchmarkConsumeHandDedup of idemkafka,
// idemnats and idemamqp), for the table bench/consumers writes and the
// figure bench/plot draws.
package baseline

// Other is idem's batch path over a store other than Redis.
type Other struct{ Label, Name string }

// A Group is one broker at one number of messages in flight: the
// benchmarks of its paths in package Pkg (names without "Benchmark" and
// the -GOMAXPROCS suffix), "" where there is none.
type Group struct {
	Broker, InFlight string
	Pkg              string
	Bare             string // the consumer without dedup
	Hand             string // the hand-written dedup over Redis
	Single, Batch    string // idem's single and batch paths over the same Redis
	Others           []Other
}

// Groups are the brokers, in the order they are shown.
var Groups = []Group{
	{Broker: "Kafka (kfake)", InFlight: "poll of 100", Pkg: "idemkafka", Bare: "Consume/bare", Hand: "ConsumeHandDedup/redis", Batch: "Consume/idemkafka+redis",
		Others: []Other{{"idem batch path, DynamoDB Local", "Consume/idemkafka+dynamodb"}, {"idem batch path, PostgreSQL", "Consume/idemkafka+postgres"}}},
	{Broker: "NATS JetStream", InFlight: "16", Pkg: "idemnats", Bare: "Consume/bare/c=16", Hand: "ConsumeHandDedup/redis/c=16", Single: "Consume/redis/c=16", Batch: "ConsumeBatch/redis/c=16"},
	{Broker: "NATS JetStream", InFlight: "32", Pkg: "idemnats", Hand: "ConsumeHandDedup/redis/c=32", Batch: "ConsumeBatch/redis/c=32"},
	{Broker: "RabbitMQ", InFlight: "16", Pkg: "idemamqp", Bare: "Consume/bare/c16", Hand: "ConsumeHandDedup/redis/c16", Single: "Consume/redis/c16", Batch: "ConsumeBatch/redis/c16"},
	{Broker: "RabbitMQ", InFlight: "32", Pkg: "idemamqp", Hand: "ConsumeHandDedup/redis/c32", Batch: "ConsumeBatch/redis/c32"},
}

// Key is the benchmark's key in the tables: "<package> <name>", "" for no
// benchmark.
func (g Group) Key(name string) string {
	if name == "" {
		return ""
	}
	return g.Pkg + " " + name
}
