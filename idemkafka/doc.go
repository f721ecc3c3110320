// Package idemkafka runs a Kafka consumer group's records through an
// [idem.Engine] (with franz-go, github.com/twmb/franz-go/pkg/kgo), and
// commits a partition's offset only past records that are settled: whose
// outcome is recorded, or that were dead-lettered.
//
// # Settling a record is committing its offset
//
// Kafka has no per-record acknowledgement: a consumer group keeps one
// committed offset per partition, and whoever consumes the partition next
// starts there. So a record is settled when the committed offset moves past
// it, and a [Consumer] moves it, partition by partition, only up to the
// first record that is not settled. The engine's answer for each record is
// turned into a verdict by [consume.Decide], the one rule every idem
// consumer follows (its package doc has the table and the reasons), and
// carried out so:
//
//	consume.Done        settled, its outcome recorded (or replayed): the
//	                    offset may move past it; with its outcome not
//	                    recorded (consume.ErrOutcomeNotRecorded in its
//	                    Err), as Retry: see below
//	consume.DeadLetter  settled once Config.DeadLetter has a copy (headers:
//	                    HeaderReason, HeaderTopic, HeaderPartition,
//	                    HeaderOffset), or at once, logged, without one
//	consume.RetryAfter  the partition stops at it, and comes back to it
//	                    after the verdict's Delay (the other holder's lease)
//	consume.Retry       the partition stops at it, and comes back to it
//	                    after Config.RetryDelay
//	consume.Leave       as Retry: an uncertain outcome keeps its claim until
//	                    its lease ends (the record then waits, as RetryAfter);
//	                    a write refused because the key was taken over, or a
//	                    claim lost while the record waited its turn in its
//	                    batch (it did not run), leaves the record to the
//	                    consumer that took the key
//
// A partition that stops is sought back to the stopping record
// (kgo.Client.SetOffsets) and paused until it may come again; the offset
// committed for it is that record's, never one past it. The other
// partitions go on. The records after the stopping one come again too
// ([ErrBehind]): any whose outcome was recorded replays it, and does not
// run again; any other is retried.
//
// # The commit rule: only what is recorded
//
// A partition is committed up to its first record whose outcome is not
// recorded, and no further. A record whose handler succeeded but whose
// outcome write failed for all of the engine's WriteTimeout (the store
// unreachable; a batched write that failed for some of its records is
// written again alone for each, and this is what remains) is consume.Done
// with consume.ErrOutcomeNotRecorded: it stops its partition there, and
// the partition comes back to it after Config.RetryDelay. The store never
// learnt that it ran, so its key is still held (IN_PROGRESS) until its
// lease ends: the record waits for that (consume.RetryAfter), and then runs
// again. The consumers that acknowledge each message instead acknowledge
// such a one, leaving a stuck record for an operator (see package
// consume); a Kafka consumer commits only what the store holds, so the
// next consumer of a partition meets no record whose outcome is lost
// behind a committed offset. The records after it in its batch may have
// run meanwhile: each replays its outcome if it was recorded.
//
// # Batches and order
//
// Each poll (up to Config.MaxPollRecords records) is a batch. A
// partition's records in it are one [idem.DoBatch], run one at a time, in
// offset order; the partitions of a batch run at once. On a store that
// claims in batches (memstore, redisstore, pgstore) the records are
// claimed together, in one round trip, and every claim is held until its
// record runs: the leases of the records waiting their turn are renewed
// together, and a record whose claim was lost while it waited (a renewal
// refused because another consumer took the key over, or its lease
// passed) does not run; it is consume.Leave, and the partition stops
// there. A record whose handler succeeded hands its outcome to the batch
// and the next record starts: the outcomes that gather while one write is
// in flight are written together (one round trip on a store that completes
// in batches), so a record's outcome is not always written before the next
// record runs; the commit waits for every outcome of the batch. On another
// store each record is claimed when its turn comes, and its outcome
// written before the next one starts. Once a record's handler
// fails with an error that is not terminal, the records after it in its
// partition are not begun (their claims are released, [ErrNotBegun]): the
// partition will come back to the failed one first. A record whose key
// another consumer holds does not stop the records after it from running,
// but it stops the commit. When every partition of the batch is settled,
// the batch's offsets are committed (synchronously), and only then is the
// next poll taken.
//
// # Keys
//
// By default a record's key is its value, the payload as the producer sent
// it, hashed (SHA-256) and scoped to its topic (the store key's tenant is
// the topic; [clientkey.Payload]), as Powertools keys a queue's messages
// by their payload: two records with the same bytes on one topic are one
// message, whichever partition or offset each came at, so a producer's
// retry is a duplicate even after a repartition, and a copy in another
// partition too. The fingerprint is the same digest, so the default never
// refuses a record as a key reused. Two records that must both run while
// their values are equal (an event without an id or timestamp of its own)
// need a key that tells them apart: choose one. A record without a value
// (a tombstone) has nothing to key it by and is dead-lettered ([ErrNoKey]).
//
// The other keys are chosen, one of them, with the value's digest as the
// fingerprint (a copy under the same key with another value is refused as
// a key reused, and dead-lettered):
//
//	Config.KeyHeader         the value of a header the producer sets, the
//	                         same on every send of the message (unscoped)
//	Config.Key               a function, such as one that reads an id
//	                         from the value (unscoped)
//	Config.KeyFromRecordKey  the record's Kafka key, scoped to its topic
//
// Why the record key is not the default: it usually names an entity (a
// customer, an account), not a message, and many records share it. Keyed
// by it, a second, different event of the same customer is refused as a
// key reused with another payload, and dead-lettered. Choose it only where
// producers give each message a key of its own. An offset (topic,
// partition, offset) names a record but not a message: a producer that
// retried a send wrote it at two offsets, so an offset key catches
// redeliveries to the consumer but not a producer's duplicate.
//
// Every key is derived by package clientkey, which `idemctl find` and the
// console's search form use too: an operator finds a record from the
// value the producer sent and its topic (`idemctl find -payload -operation
// OP -topic T -key -` reads the value from stdin), or from the chosen key
// (`-message`; with `-topic` for the record key).
//
// # Rebalances and kills
//
// The Consumer sets kgo.BlockRebalanceOnPoll: a rebalance waits for the
// batch in hand. When one is waiting (kgo.OnPartitionsCallbackBlocked),
// the batch begins no more records: the handlers running finish and record
// their outcomes, the records not begun are released, the settled
// offsets are committed, and then the rebalance goes on. So no record is
// skipped (the new owner starts at the committed offset) and none runs
// twice (one that ran replays its outcome). kgo.OnPartitionsRevoked commits
// what was settled and could not be committed before. A batch that runs
// past the group's rebalance timeout gets its member kicked out of the
// group, and its partitions lost (kgo.OnPartitionsLost): its commit fails,
// and the new owner of a partition meets the records that ran as replays
// and the records still running as keys held elsewhere, which it waits for
// (consume.RetryAfter) while their holder renews the lease. A consumer
// that was killed, or stopped long enough that its lease ran out, is taken
// over in the same way: the new owner claims the key after the lease and
// runs the record again (the operation ran at most once per key while
// claims are honoured; see the idem package doc on exactly-once effects);
// the old holder's outcome write, if it comes back, is refused
// (consume.Leave) and it commits nothing past it.
//
// # Testing against a real cluster
//
// The package's tests run on kfake (github.com/twmb/franz-go/pkg/kfake),
// an emulator of a Kafka cluster that franz-go's own tests use, started in
// the test process; CI runs them so. Set KAFKA_BROKERS (host:port, comma
// separated) to run the same tests against a real cluster (topics are
// created and deleted by the tests, so the cluster must allow it):
//
//	KAFKA_BROKERS=127.0.0.1:9092 go test -race -count=1 ./idemkafka/...
package idemkafka
