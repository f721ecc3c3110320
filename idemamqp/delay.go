package idemamqp

import (
	"context"
	"fmt"

	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Delay is a delay queue: a queue that nobody consumes, whose messages
// expire after TTL and are then dead-lettered back to the work queue
// (through the default exchange). Make one with [DeclareDelay].
type Delay struct {
	// Queue is the delay queue's name.
	Queue string
	// Work is the queue its messages return to.
	Work string
	// TTL is how long a message waits there.
	TTL time.Duration

	ch *amqp.Channel
}

// DeclareDelay declares the delay queue of the work queue work, named
// work+".idem-delay" (durable, x-message-ttl ttl, x-dead-letter-exchange ""
// and x-dead-letter-routing-key work), and puts ch in confirm mode for
// publishing to it. ch is then the Delay's: use another channel to
// consume. A message waits ttl whatever it waits for: for a key held
// elsewhere, it comes back every ttl until the holder finishes or its lease
// ends, which bounds the redeliveries to one per ttl.
func DeclareDelay(ch *amqp.Channel, work string, ttl time.Duration) (*Delay, error) {
	if ch == nil || work == "" || ttl < time.Millisecond {
		return nil, fmt.Errorf("idemamqp: DeclareDelay needs a channel, a work queue and a TTL of at least 1ms (got %v)", ttl)
	}
	name := work + ".idem-delay"
	_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
		"x-message-ttl":             ttl.Milliseconds(),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": work,
	})
	if err != nil {
		return nil, fmt.Errorf("idemamqp: declaring delay queue %s: %w", name, err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("idemamqp: confirm mode for delay queue %s: %w", name, err)
	}
	return &Delay{Queue: name, Work: work, TTL: ttl, ch: ch}, nil
}

// publish copies d to the delay queue and waits for the broker's confirm.
func (dl *Delay) publish(ctx context.Context, d amqp.Delivery) error {
	p := amqp.Publishing{
		Headers:         d.Headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		UserId:          d.UserId,
		AppId:           d.AppId,
		Body:            d.Body,
	}
	dc, err := dl.ch.PublishWithDeferredConfirmWithContext(ctx, "", dl.Queue, true, false, p)
	if err != nil {
		return fmt.Errorf("idemamqp: publishing to delay queue %s: %w", dl.Queue, err)
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("idemamqp: waiting for the confirm of delay queue %s: %w", dl.Queue, err)
	}
	if !ok {
		return fmt.Errorf("idemamqp: the broker refused (nack) the publish to delay queue %s", dl.Queue)
	}
	return nil
}
