package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/store"
)

// BenchmarkStepAgainstComplete measures, in one run and in turns so that
// every case sees the same load, what a step costs beside a Complete of
// the same size, and what resuming costs beside a plain takeover. Per
// result size N (100 B, 4 KiB) and per case:
//
//   - complete: Complete of a claimed key with a result of N bytes;
//   - step1: RecordStep of a first step with a result of N bytes;
//   - step5: RecordStep of a 5th step (N bytes) on a key holding 4 such;
//   - takeover0: a takeover claim (lease passed) of a key with no step;
//   - takeover4: the same of a key holding 4 steps of N bytes, which
//     come back in the claim's answer.
//
// Each reports CASE-ns/op (wall time, one call at a time), CASE-trips/op
// (commands the client sent, counted by a hook: each is one round trip,
// as nothing is pipelined), CASE-srv-cpu-µs/op (INFO cpu: the Redis
// process's user + sys CPU, network I/O included; run it alone) and
// CASE-srv-µs/op (INFO commandstats: the usec Redis spent executing
// the commands), and the ratios step1/complete and step5/complete of
// srv-cpu-µs/op. The setup of each case (claims, earlier steps) runs
// outside the measured part. Reproduce:
//
//	cd store/redisstore && go test -run '^$' -bench StepAgainstComplete -benchtime 4000x -count 3
func BenchmarkStepAgainstComplete(b *testing.B) {
	ctx := context.Background()
	for _, size := range []int{100, 4 << 10} {
		name := fmt.Sprintf("N=%dB", size)
		if size >= 1<<10 {
			name = fmt.Sprintf("N=%dKiB", size>>10)
		}
		b.Run(name, func(b *testing.B) {
			s, c, cnt := benchStore(b)
			result := bytes.Repeat([]byte{'x'}, size)
			now := store.Millis(time.Now()) // the native expiry follows ExpiresAt
			exp := now + 10*60_000
			seq := 0
			// claim claims a fresh key (its lease ends at now+1) and
			// records steps steps of N bytes in it.
			claim := func(steps int) store.ClaimRef {
				seq++
				p := store.ClaimParams{Key: "k" + strconv.Itoa(seq), Fingerprint: "fp", Owner: "a", Now: now, LeaseUntil: now + 1, ExpiresAt: exp}
				res, err := s.Claim(ctx, p)
				if err != nil || !res.Acquired {
					b.Fatalf("claim %s: %+v, %v", p.Key, res, err)
				}
				ref := store.ClaimRef{Key: p.Key, Fence: res.Record.Fence, Owner: "a", Now: now}
				for i := range steps {
					if err := s.RecordStep(ctx, store.StepParams{ClaimRef: ref, Index: i, Step: store.Step{Name: "step" + strconv.Itoa(i), Result: result, At: now}}); err != nil {
						b.Fatal(err)
					}
				}
				return ref
			}
			step := func(ref store.ClaimRef, i int) error {
				return s.RecordStep(ctx, store.StepParams{ClaimRef: ref, Index: i, Step: store.Step{Name: "step" + strconv.Itoa(i), Result: result, At: now}})
			}
			takeover := func(ref store.ClaimRef, steps int) error {
				p := store.ClaimParams{Key: ref.Key, Fingerprint: "fp", Owner: "b", Now: now + 10, LeaseUntil: now + 20, ExpiresAt: exp}
				res, err := s.Claim(ctx, p)
				if err == nil && (!res.Acquired || !res.Takeover || len(res.Record.Steps) != steps) {
					err = fmt.Errorf("takeover of %s: %+v, want acquired with %d steps", ref.Key, res, steps)
				}
				return err
			}
			type bench struct {
				name  string
				steps int // held before the measured call
				op    func(store.ClaimRef) error
			}
			cases := []bench{
				{"complete", 0, func(r store.ClaimRef) error {
					return s.Complete(ctx, store.CompleteParams{ClaimRef: r, ExpiresAt: exp, Result: result})
				}},
				{"step1", 0, func(r store.ClaimRef) error { return step(r, 0) }},
				{"step5", 4, func(r store.ClaimRef) error { return step(r, 4) }},
				{"takeover0", 0, func(r store.ClaimRef) error { return takeover(r, 0) }},
				{"takeover4", 4, func(r store.ClaimRef) error { return takeover(r, 4) }},
			}
			// Warm: the scripts loaded, the connection open.
			for _, bc := range cases {
				if err := bc.op(claim(bc.steps)); err != nil {
					b.Fatal(err)
				}
			}
			const turn = 250
			wall := make([]time.Duration, len(cases))
			usec := make([]float64, len(cases))
			cpu := make([]float64, len(cases))
			trips := make([]int64, len(cases))
			refs := make([]store.ClaimRef, turn)
			b.ResetTimer()
			for from := 0; from < b.N; from += turn {
				n := min(turn, b.N-from)
				for i, bc := range cases {
					b.StopTimer()
					for j := range n {
						refs[j] = claim(bc.steps)
					}
					before := sentCommands(cnt)
					b.StartTimer()
					u, cp := serverCost(b, c, cnt, func() {
						t0 := time.Now()
						for j := range n {
							if err := bc.op(refs[j]); err != nil {
								b.Fatal(err)
							}
						}
						wall[i] += time.Since(t0)
					})
					b.StopTimer()
					trips[i] += sentCommands(cnt) - before
					usec[i] += u
					cpu[i] += cp
					b.StartTimer()
				}
			}
			b.StopTimer()
			per := func(v float64) float64 { return v / float64(b.N) }
			for i, bc := range cases {
				b.ReportMetric(per(float64(wall[i].Nanoseconds())), bc.name+"-ns/op")
				b.ReportMetric(per(float64(trips[i])), bc.name+"-trips/op")
				b.ReportMetric(per(cpu[i]), bc.name+"-srv-cpu-µs/op")
				b.ReportMetric(per(usec[i]), bc.name+"-srv-µs/op")
			}
			b.ReportMetric(cpu[1]/cpu[0], "step1/complete-cpu")
			b.ReportMetric(cpu[2]/cpu[0], "step5/complete-cpu")
		})
	}
}

// sentCommands is the number of commands cnt has seen, but the INFO that
// serverCost sends and the handshake's.
func sentCommands(cnt *sent) int64 {
	var n int64
	for name, v := range cnt.snapshot() {
		if name != "info" && name != "hello" && name != "client" {
			n += v
		}
	}
	return n
}
