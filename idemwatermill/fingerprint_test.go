package idemwatermill_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/consume"
	"github.com/seed-a1b882c0/idem/idemwatermill"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// A redelivery carries metadata its first delivery did not (RabbitMQ's
// "_watermill_amqp_redelivered"): Watermill's own fields are not in the
// fingerprint, so it replays; a field of the message's own that differs is
// a key reused, dead-lettered, unless IgnoreMetadata names it.
func TestFingerprintMetadata(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		field, val string
		ignore     []string
		want       consume.Action
	}{
		{"watermill's redelivered flag", "_watermill_amqp_redelivered", "true", nil, consume.Done},
		{"watermill's requeuer count", "_watermill_requeuer_retries", "2", nil, consume.Done},
		{"a field of the message's own", "Region", "eu", nil, consume.DeadLetter},
		{"a field IgnoreMetadata names", "Sent-At", "12:00", []string{"Sent-At"}, consume.Done},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := memstore.New(nil)
			t.Cleanup(func() { st.Close() })
			e := newEngine(t, st, idem.Config{Lease: 30 * time.Second})
			var got []consume.Action
			mw, err := idemwatermill.Middleware(e, &idemwatermill.Config{Operation: "ship", MetadataKey: "Idem-Key", IgnoreMetadata: tc.ignore, MaxDelay: -1,
				Settled: func(_ *message.Message, v consume.Verdict) { got = append(got, v.Action) }})
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			h := mw(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })
			first := msg("order-1", []byte(`{"order":1}`))
			again := first.Copy()
			again.Metadata.Set(tc.field, tc.val)
			_, _ = h(first)
			_, err = h(again)
			if runs != 1 || len(got) != 2 || got[0] != consume.Done || got[1] != tc.want {
				t.Fatalf("ran %d times, verdicts %v (%v); want once, then %v", runs, got, err, tc.want)
			}
			if (err != nil) != (tc.want != consume.Done) {
				t.Fatalf("the copy's error: %v", err)
			}
		})
	}
}
