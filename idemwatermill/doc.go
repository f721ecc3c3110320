// Package idemwatermill is a Watermill (github.com/ThreeDotsLabs/watermill)
// handler middleware backed by an [idem.Engine]: a message's handler runs
// at most once per key, across restarts and replicas, on every broker
// Watermill's router consumes from.
//
// Watermill's own middleware.Deduplicator keeps the keys it has seen in
// the memory of one process (or a repository of one's own): it forgets on
// restart, cannot see a copy that another replica consumed, and marks a
// message seen before its handler ran, so a failed handler's redelivery is
// dropped. This middleware claims the key in a shared store before the
// handler runs and records the outcome after, as every idem consumer does.
//
// # Keys and fingerprint
//
// By default a message's key is its payload, as the producer sent it,
// hashed (SHA-256) and scoped to the topic the router subscribed to
// (message.SubscribeTopicFromCtx; the store key's tenant is the topic,
// clientkey.TopicTenant), as Powertools keys a queue's messages by their
// payload: a copy of the message is a duplicate however it was published
// again, while Watermill's publishers give every publish a new UUID unless
// the producer sets it. The fingerprint is the same digest, so the default
// never refuses a message as a key reused. Two messages that must both run
// while their payloads are equal need a key that tells them apart: choose
// one. A message with an empty payload has nothing to key it by and is
// dead-lettered ([ErrNoKey]). A message handled outside a router has no
// topic: its payload key is then unscoped.
//
// The other keys are chosen, one of them, unscoped: Config.MetadataKey (a
// metadata field the producer sets, the same on every publish of the
// message), Config.Key (a function) or Config.KeyFromUUID (the UUID, for
// producers that set it from their own id). With a chosen key the
// fingerprint is the SHA-256 of the payload and the metadata (every field
// but Config.IgnoreMetadata's and Watermill's own, named "_watermill_…",
// which its Pub/Subs set per delivery, such as watermill-amqp's
// redelivered flag): a copy with the same key and another payload or
// metadata is refused as a key reused, and dead-lettered.
//
// Every key is derived by package clientkey, which `idemctl find` and the
// console's search form use too: an operator finds a record from the
// payload the producer sent and the topic (`idemctl find -payload
// -operation OP -topic T -key -` reads the payload from stdin), or from
// the chosen key (`-message`).
//
// # Verdicts, Ack and Nack
//
// The engine's answer is turned into a verdict by [consume.Decide], the one
// rule every idem consumer follows (its package doc has the table and the
// reasons), and carried out with the router's Ack and Nack:
//
//	consume.Done        the handler's messages are returned (replayed from
//	                    the record when it ran before): the router publishes
//	                    them and acks
//	consume.DeadLetter  a *VerdictError ([IsDeadLetter] true): nack
//	consume.RetryAfter  a *VerdictError after waiting the other holder's
//	                    lease (at most Config.MaxDelay): nack
//	consume.Retry       a *VerdictError: nack
//	consume.Leave       a *VerdictError: nack; an uncertain outcome keeps its
//	                    claim, so the redelivery waits as RetryAfter
//
// A replayed success returns the messages the handler produced the first
// time, with their UUIDs, so the router publishes them again: a consumer
// downstream keyed by UUID sees them once.
//
// # With Retry and PoisonQueue
//
// Put the middleware innermost, after the router's Retry and PoisonQueue
// (middlewares run in the order added; the first is the outermost):
//
//	router.AddMiddleware(
//		poison, // middleware.PoisonQueueWithFilter(pub, "poison", idemwatermill.IsDeadLetter)
//		middleware.Retry{MaxRetries: 3, ShouldRetry: func(p middleware.RetryParams) bool {
//			return !idemwatermill.IsDeadLetter(p.Err)
//		}}.Middleware,
//	)
//	idemwatermill.AddConsumerHandler(router, engine, cfg, ...)
//
// So a dead letter (a terminal error, a key reused with another payload,
// no key) is not retried and goes to the poison queue, acked there; a
// retryable error is retried in process by Retry, each attempt a call
// through the engine (the claim was released), and then nacked for the
// broker to redeliver, or, with a PoisonQueue without the filter, put in
// the poison queue (it may still succeed: use the filter). A message whose
// key another consumer holds comes back as a nack after the wait. Never put
// Watermill's Deduplicator or InstantAck outside this middleware: both
// settle a message before its handler succeeded.
//
// # Tests
//
// On the real servers the machine runs, through Watermill's own
// publishers and subscribers: Redis Streams (watermill-redisstream), NATS
// JetStream (watermill-nats), RabbitMQ (watermill-amqp) and PostgreSQL
// (watermill-sql, its queue schema). On each: the consumers' verdict
// table; two router processes on one topic with one SIGKILLed in a
// handler or before an ack; a router process stopped (SIGSTOP) in a
// handler, its message and key taken over by another, whose outcome write
// is then refused (a zombie); and a side by side with Watermill's
// Deduplicator (a restart, a second replica). On Redis Streams: Retry and
// PoisonQueue composed, and a replay.
package idemwatermill
