package idemprom_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemprom"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

func ExampleNew() {
	// In a program: idemprom.MustNew(prometheus.DefaultRegisterer, nil),
	// with promhttp.Handler() serving /metrics.
	reg := prometheus.NewRegistry()
	obs := idemprom.MustNew(reg, nil)

	mem := memstore.New(nil)
	defer mem.Close()
	eng, err := idem.New(mem, &idem.Config{Observer: obs})
	if err != nil {
		panic(err)
	}
	req := idem.Request{Operation: "charge", Key: "order-42", Payload: []byte(`{"amount":100}`)}
	for range 2 {
		if _, err := idem.Do(context.Background(), eng, req, func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
			panic(err)
		}
	}

	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if v := m.GetCounter().GetValue(); v > 0 {
				fmt.Println(f.GetName(), m.GetLabel()[0].GetValue(), m.GetLabel()[1].GetValue(), v)
			}
			if h := m.GetHistogram(); h != nil {
				fmt.Println(f.GetName(), m.GetLabel()[0].GetValue(), m.GetLabel()[1].GetValue(), h.GetSampleCount())
			}
		}
	}
	// Output:
	// idem_outcomes_total charge acquired 1
	// idem_outcomes_total charge replayed 1
	// idem_store_call_duration_seconds claim ok 2
	// idem_store_call_duration_seconds complete ok 1
}
