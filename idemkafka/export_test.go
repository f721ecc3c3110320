package idemkafka

// RebalanceWaiting reports whether a rebalance waits for c's batch in
// hand (kgo.OnPartitionsCallbackBlocked fired), for the tests that hold a
// batch until one does.
func RebalanceWaiting(c *Consumer) bool { return c.rebalance.Load() }
