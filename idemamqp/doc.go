// Package idemamqp makes a RabbitMQ (AMQP 0-9-1) consumer idempotent with
// idem: every message runs its handler at most once per key, and every
// delivery is settled by what happened.
//
// A [Consumer] wraps a handler func(ctx, amqp.Delivery) error. Its key is
// the message's MessageId (or [Config.Key] over the body; never the
// redelivered flag), its payload fingerprint the body's SHA-256, so a
// MessageId reused with another body is rejected rather than replayed.
//
// # Outcomes
//
// The engine's answer becomes a verdict by consume.Decide, the one rule
// of every idem consumer (its package doc has the full table and the
// reasons), carried out so:
//
//	consume.Done        handler succeeded (now or replayed)          Ack
//	consume.DeadLetter  terminal error (idem.Terminal, or replayed), Reject, no requeue → dead-letter exchange
//	                    key reused with another body, no key
//	consume.RetryAfter  in progress elsewhere (after Config.Wait)    Delay queue, else hold Backoff + requeue
//	consume.Retry       retryable error, store error                 Delay queue, else hold Backoff + requeue
//	consume.Leave       uncertain (idem.Uncertain), key taken over   Delay queue, else hold Backoff + requeue
//	(consumer shutting down: ctx done)                               Nack + requeue at once
//
// A delivery is never acknowledged before its handler succeeded, nor left
// unsettled. An uncertain outcome keeps the key's claim until its lease
// ends; its copies keep coming back (once per delay) until then, and the
// first after it runs the handler again, as after a crash.
//
// # Delay queue
//
// [DeclareDelay] declares a queue whose messages expire after a TTL into
// the work queue. A message to be tried later is published there, and the
// original acknowledged only once the broker confirmed the publish: a crash
// in between leaves two copies, which idem tells apart.
//
// # Batches
//
// [Consumer.RunBatch] collects deliveries into batches of up to
// [BatchArgs].Size (what the delivery channel holds, and, when that is
// fewer, what arrives within Window of the first, on the system clock as
// every idem consumer forms its batches),
// on the same batch workers ([idem.WithBatchWorkers]), Batches batches at once, with the channel's prefetch
// count set to Size × Batches, and hands each to [Consumer.HandleBatch]:
// the keys are claimed by idem.DoBatch in one store round trip where the
// store claims in batches (redisstore's pipeline, memstore), each handler
// runs under its own lease and writes its own outcome, and each delivery is
// settled by its own verdict with the same code as [Consumer.Handle], as
// soon as its own outcome is recorded (not at its batch's pace): its
// own Ack, Reject or Nack, never an acknowledgement with multiple=true,
// which would settle deliveries whose outcome did not land. A delivery
// without a key is rejected alone; a key named twice in one batch runs the
// handler once. See docs/consumers-batch.md.
//
// # Manual acknowledgement and the consumer timeout
//
// [Consumer.Run] consumes with manual acknowledgement and refuses auto-ack
// (with auto-ack a crash loses the message). The broker closes a channel
// whose delivery stays unacknowledged longer than its consumer_timeout
// (default 30m) and redelivers it; [New] refuses an engine whose Lease or
// Wait is not shorter than [Config.ConsumerTimeout].
package idemamqp
