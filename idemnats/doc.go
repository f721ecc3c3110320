// Package idemnats makes a NATS JetStream message handler idempotent with
// an [idem.Engine], and acknowledges each message only after its outcome
// is recorded.
//
// # Acknowledgement follows the outcome
//
// The message's key (the Nats-Msg-Id header by default, or Config.Key)
// names the record; the payload is fingerprinted. The engine's answer is
// turned into a verdict by [consume.Decide], the one rule every idem
// consumer follows (its package doc has the table and the reasons), and
// carried out so:
//
//	consume.Done        Ack
//	consume.DeadLetter  Term, so JetStream stops redelivering it
//	consume.RetryAfter  NakWithDelay until the other holder's lease ends
//	consume.Retry       Nak, so the message comes again at once
//	consume.Leave       nothing: JetStream redelivers after AckWait
//
// A message without a usable key is terminated too: its verdict is
// Decide's for consume.NoKey's error, DeadLetter. Leave is an uncertain outcome (the
// claim is kept until its lease ends) or a zombie's: the key was taken over
// while fn ran, and an ack would settle a delivery the new holder is still
// working on.
//
// While fn runs, the engine renews the claim's lease and the wrapper calls
// msg.InProgress every Config.Heartbeat, so JetStream does not redeliver a
// long-running message to another consumer.
//
// # Batches
//
// [WrapBatch] handles messages fetched together ([ConsumeBatch] reads
// the consumer through one long-lived pull, consumer.Messages, that keeps
// up to BatchConfig.Ahead messages delivered ahead of the batches; a
// batch is what the pull has delivered, up to BatchConfig.Size, and, when
// that is fewer, what it delivers within BatchConfig.Wait of the first,
// as consume.Collect forms every idem consumer's batches; and it runs them
// on the same batch workers, [idem.WithBatchWorkers]).
// The keys of a batch are claimed by [idem.DoBatch] in one store round
// trip where the store claims in batches (redisstore's pipeline,
// memstore); each handler then runs under its own lease, Config.Concurrency
// at once, and writes its own outcome; and each message is settled by its
// own verdict, with the same code and the same table as above, as soon as
// its own outcome is recorded (not at its batch's pace). A message
// without a key is terminated alone; a key named twice in one batch runs
// the handler once (the later copy answers as a concurrent call in one
// process: in progress, so NakWithDelay, unless the engine waits, and
// then a replay, so Ack); one message's failed outcome write or refused
// write settles only that message. Every message of a batch gets
// InProgress every Heartbeat until it is settled, unless its claim was
// lost while its handler ran; before its batch runs, a message waits
// behind at most about Ahead / (Size × Batches) + 2 batch durations,
// which the consumer's AckWait must outlast. See docs/consumers-batch.md.
package idemnats
