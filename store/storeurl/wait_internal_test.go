package storeurl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// flaky fails its first n opens with store.ErrUnavailable, noting when
// each attempt was made.
type flaky struct {
	n     int
	calls []time.Time
}

func (f *flaky) open(ctx context.Context) (*Opened, error) {
	f.calls = append(f.calls, time.Now())
	if len(f.calls) <= f.n {
		return nil, fmt.Errorf("dial: %w", store.ErrUnavailable)
	}
	s := memstore.New(&memstore.Config{SweepInterval: -1})
	return &Opened{Store: s, closer: s.Close}, nil
}

func TestOpenWaitRetriesWithCappedBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 8}
		var retries []Retry
		start := time.Now()
		s, err := OpenWait(t.Context(), "memory:", nil, WaitOptions{Wait: time.Minute, Backoff: 100 * time.Millisecond, MaxBackoff: time.Second,
			open: f.open, OnRetry: func(r Retry) { retries = append(retries, r) }})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if len(f.calls) != 9 || len(retries) != 8 {
			t.Fatalf("%d attempts, %d retries reported; want 9 and 8", len(f.calls), len(retries))
		}
		for i := 1; i < len(f.calls); i++ {
			pause := f.calls[i].Sub(f.calls[i-1])
			want := min(100*time.Millisecond<<(i-1), time.Second)
			if pause < want/2 || pause > want {
				t.Errorf("pause %d: %v, want %v..%v", i, pause, want/2, want)
			}
			if r := retries[i-1]; r.Attempt != i || r.Next != pause || !errors.Is(r.Err, store.ErrUnavailable) {
				t.Errorf("retry %d reported as %+v (pause %v)", i, r, pause)
			}
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("took %v", d)
		}
	})
}

func TestOpenWaitGivesUpWhenTheWaitIsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 1 << 30}
		start := time.Now()
		_, err := OpenWait(t.Context(), "redis://u:secret@h:1/0", nil, WaitOptions{Wait: 10 * time.Second, open: f.open})
		var we *WaitError
		if !errors.As(err, &we) || !errors.Is(err, store.ErrUnavailable) || we.Attempts != len(f.calls) || we.Wait != 10*time.Second {
			t.Fatalf("%v (%d attempts), want a WaitError wrapping ErrUnavailable", err, len(f.calls))
		}
		if d := time.Since(start); d > 10*time.Second || d < 5*time.Second {
			t.Errorf("gave up after %v of a 10s wait", d)
		}
		if len(f.calls) < 5 {
			t.Errorf("only %d attempts in 10s", len(f.calls))
		}
		for _, bad := range []string{"secret"} {
			if strings.Contains(err.Error(), bad) {
				t.Errorf("the error shows the password: %v", err)
			}
		}
	})
}

func TestOpenWaitFailsAtOnceOnAConfigurationFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		_, err := OpenWait(t.Context(), "memory:", nil, WaitOptions{Wait: time.Minute, open: func(context.Context) (*Opened, error) {
			calls++
			return nil, fmt.Errorf("role lacks INSERT: %w", idem.ErrInvalidConfig)
		}})
		if !errors.Is(err, idem.ErrInvalidConfig) || calls != 1 {
			t.Fatalf("%v after %d attempts; want the configuration error after one", err, calls)
		}
		var we *WaitError
		if errors.As(err, &we) {
			t.Fatalf("a configuration fault reported as a wait: %v", err)
		}
	})
}

func TestOpenWaitZeroWaitIsOneAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 1}
		_, err := OpenWait(t.Context(), "memory:", nil, WaitOptions{open: f.open})
		if !errors.Is(err, store.ErrUnavailable) || len(f.calls) != 1 {
			t.Fatalf("%v after %d attempts", err, len(f.calls))
		}
	})
}

func TestStartOpenReportsStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 3}
		p := StartOpen(t.Context(), "memory:", nil, WaitOptions{Wait: time.Minute, Backoff: time.Second, MaxBackoff: time.Second,
			open: f.open})
		defer p.Close()
		synctest.Wait()
		st := p.Status()
		if st.Ready || st.Done || st.Attempts != 1 || !errors.Is(st.Err, store.ErrUnavailable) {
			t.Fatalf("after the first attempt: %+v", st)
		}
		s, err := p.Result()
		if err != nil || s == nil {
			t.Fatalf("%v, %v", s, err)
		}
		if st := p.Status(); !st.Ready || !st.Done || st.Attempts != 4 || st.Err != nil {
			t.Fatalf("once open: %+v", st)
		}
	})
}

func TestStartOpenCloseStopsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{n: 1 << 30}
		p := StartOpen(t.Context(), "memory:", nil, WaitOptions{Wait: time.Hour, open: f.open})
		time.Sleep(3 * time.Second)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if st := p.Status(); !st.Done || st.Ready || !errors.Is(st.Err, context.Canceled) {
			t.Fatalf("after Close: %+v", st)
		}
	})
}
