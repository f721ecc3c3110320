package idemprom_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seed-a1b882c0/idem/idemprom"
	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// The Observer's hot path: an operation already seen, a store call whose
// (op, result) pair already occurred. Both should allocate nothing.
//
//	cd idemprom && go test -run '^$' -bench . -benchmem
func BenchmarkObserve(b *testing.B) {
	obs := idemprom.MustNew(prometheus.NewRegistry(), &idemprom.Config{Operations: []string{"charge", "refund", "payout"}})
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			obs.Observe("refund", observe.OutcomeReplayed)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				obs.Observe("refund", observe.OutcomeReplayed)
			}
		})
	})
}

func BenchmarkStoreCall(b *testing.B) {
	obs := idemprom.MustNew(prometheus.NewRegistry(), nil)
	fenced := fmt.Errorf("complete: %w", &store.FencedError{Key: "k"})
	for _, bc := range []struct {
		name string
		err  error
	}{{"ok", nil}, {"fenced", fenced}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				obs.StoreCall(observe.StoreComplete, 1500*time.Microsecond, bc.err)
			}
		})
	}
	b.Run("ok/parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				obs.StoreCall(observe.StoreClaim, 1500*time.Microsecond, nil)
			}
		})
	})
}

// BenchmarkWithLabelValues is the plain client_golang way, a label lookup
// per call, for comparison.
func BenchmarkWithLabelValues(b *testing.B) {
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "o"}, []string{"operation", "outcome"})
	calls := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h"}, []string{"op", "result"})
	b.Run("counter", func(b *testing.B) {
		for b.Loop() {
			outcomes.WithLabelValues("refund", observe.OutcomeReplayed.String()).Inc()
		}
	})
	b.Run("histogram", func(b *testing.B) {
		for b.Loop() {
			calls.WithLabelValues(string(observe.StoreComplete), "ok").Observe(0.0015)
		}
	})
}
