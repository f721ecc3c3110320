// Package failover measures what a store's failover loses: callers run the
// engine on fresh keys while the test kills a server, and every outcome
// the engine acknowledged is read back afterwards. The tests of
// redisstore (Cluster, Sentinel) and pgstore (a streaming standby) use it;
// docs/failover.md has their figures. Test-only.
package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// Round is what one failover under load measured.
type Round struct {
	// Setting names what the round ran with (such as "WaitReplicas 1").
	Setting string `json:"setting"`
	// Killed is the server killed.
	Killed string `json:"killed"`
	// Acked counts the calls whose outcome the engine acknowledged: Do
	// returned it and Result.Recorded is COMPLETED.
	Acked int `json:"acknowledged"`
	// Lost counts the acknowledged outcomes that did not replay after the
	// failover (record missing, not COMPLETED, or another result).
	Lost     int      `json:"lost"`
	LostKeys []string `json:"lost_keys,omitempty"`
	// Errors counts the failed calls by kind.
	Errors map[string]int `json:"errors"`
	// FailoverMs is from the kill until the replica served as primary.
	FailoverMs int64 `json:"failover_ms"`
	// RelinkedMs is from the kill until the killed server was back as a
	// linked replica (zero where it is not brought back).
	RelinkedMs int64 `json:"relinked_ms,omitempty"`
	// RecoverMs is from the kill until the last failed call.
	RecoverMs int64 `json:"recover_ms"`
}

func (r Round) String() string {
	back := ""
	if r.RelinkedMs > 0 {
		back = fmt.Sprintf(", killed server back as a replica %d ms", r.RelinkedMs)
	}
	return fmt.Sprintf("%s: killed %s; %d acknowledged, %d lost; errors %v; failover %d ms%s, last error %d ms after the kill",
		r.Setting, r.Killed, r.Acked, r.Lost, r.Errors, r.FailoverMs, back, r.RecoverMs)
}

// Operation is the operation name the callers use.
const Operation = "failover"

// Load is 16 callers running Do on fresh keys until Finish.
type Load struct {
	e       *idem.Engine
	mu      sync.Mutex
	acked   map[string]string // key → the result Do returned, recorded
	errors  map[string]int
	lastErr time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
}

// Start starts the callers on e.
func Start(e *idem.Engine) *Load {
	l := &Load{e: e, acked: map[string]string{}, errors: map[string]int{}, stop: make(chan struct{})}
	for w := range 16 {
		l.wg.Go(func() { l.call(w) })
	}
	return l
}

func (l *Load) call(w int) {
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		default:
		}
		key, want := fmt.Sprintf("w%d-%d", w, n), fmt.Sprintf("v%d-%d", w, n)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := idem.Do(ctx, l.e, idem.Request{Operation: Operation, Key: key}, func(context.Context) (string, error) { return want, nil })
		cancel()
		l.mu.Lock()
		switch {
		case err == nil && r.Recorded == idem.StatusCompleted:
			l.acked[key] = want
		case err == nil:
			l.errors["outcome not recorded"]++
			l.lastErr = time.Now()
		default:
			l.errors[kind(err)]++
			l.lastErr = time.Now()
		}
		l.mu.Unlock()
	}
}

func kind(err error) string {
	var ip *idem.InProgressError
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return "store unavailable"
	case errors.As(err, &ip):
		return "in progress"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline exceeded"
	}
	return err.Error()
}

// Finish stops the callers, puts what they saw into r (killed is when the
// server was killed), and reads every acknowledged outcome back through s.
func (l *Load) Finish(t testing.TB, s store.Store, killed time.Time, r *Round) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	r.Errors = l.errors
	if !l.lastErr.IsZero() {
		r.RecoverMs = l.lastErr.Sub(killed).Milliseconds()
	}
	ctx := context.Background()
	r.Acked = len(l.acked)
	for key, want := range l.acked {
		id, err := (&idem.Request{Operation: Operation, Key: key}).Identity()
		if err != nil {
			t.Fatal(err)
		}
		var rec *store.Record
		for range 100 { // the client may still be catching up with the new topology
			rec, err = s.Get(ctx, id.StoreKey.String())
			if err == nil || errors.Is(err, store.ErrNotFound) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		switch {
		case err != nil && !errors.Is(err, store.ErrNotFound):
			t.Fatalf("reading %s back: %v", key, err)
		case err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != strconv.Quote(want):
			r.Lost++
			r.LostKeys = append(r.LostKeys, key)
		}
	}
	slices.Sort(r.LostKeys)
}

// Rounds is how many rounds a measurement runs: IDEM_FAILOVER_ROUNDS,
// default 1.
func Rounds(t testing.TB) int {
	v := os.Getenv("IDEM_FAILOVER_ROUNDS")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("IDEM_FAILOVER_ROUNDS=%q: a positive number", v)
	}
	return n
}

// Report logs the rounds and, when IDEM_FAILOVER_OUT names a folder,
// writes them there as name.json.
func Report(t testing.TB, name string, rounds []Round) {
	t.Helper()
	for i, r := range rounds {
		t.Logf("round %d %v", i, r)
	}
	dir := os.Getenv("IDEM_FAILOVER_OUT")
	if dir == "" {
		return
	}
	b, err := json.MarshalIndent(rounds, "", "  ")
	if err == nil {
		err = os.WriteFile(dir+"/"+name+".json", b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}
