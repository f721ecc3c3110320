package main

import (
	"fmt"
	"testing"
	"time"
)

// TestSIGKILLMidRequest kills the gateway (bolt store) 20 times while a
// request is at the upstream. After each restart the interrupted key is held
// off (409) until its lease ends — never re-executed before — and after the
// lease exactly one retry re-executes it. Responses completed before a kill
// are never lost.
func TestSIGKILLMidRequest(t *testing.T) {
	const (
		kills = 20
		lease = 3 * time.Second
	)
	up := newUpstream(t)
	db := t.TempDir() + "/gw.db"
	args := []string{"-upstream", up.srv.URL, "-store", "bolt://" + db, "-lease", lease.String()}
	release := up.holdAll()
	defer release()
	sent := make([]time.Time, kills)
	completed := map[string]string{}
	var gw *proc
	for i := range kills {
		gw = startGateway(t, args...)
		if i > 0 {
			// The key interrupted by the previous kill is still held.
			prev := fmt.Sprintf("cut-%d", i-1)
			if a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", prev); a.status != 409 || a.problemType() != "in-progress" {
				t.Fatalf("kill %d: retry of %s right after the restart: %+v\n%s", i, prev, a, gw.logs)
			}
		}
		// One request completes before the kill...
		done := fmt.Sprintf("done-%d", i)
		release()
		a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", done)
		if a.status != 201 {
			t.Fatalf("kill %d: %+v", i, a)
		}
		completed[done] = a.body
		<-up.arrived
		// ...and one is at the upstream when the gateway dies.
		release = up.holdAll()
		cut := fmt.Sprintf("cut-%d", i)
		sent[i] = time.Now()
		go send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", cut)
		if k := <-up.arrived; k != cut {
			t.Fatalf("upstream got %q, want %q", k, cut)
		}
		gw.kill()
	}
	release()
	gw = startGateway(t, args...)
	for key, body := range completed {
		if a := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", key); !a.replayed() || a.body != body {
			t.Fatalf("completed %s lost: %+v", key, a)
		}
	}
	for i := range kills {
		cut := fmt.Sprintf("cut-%d", i)
		var a answer
		// Retry as a client would, after the Retry-After the gateway gives.
		for {
			a = send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", cut)
			if a.status != 409 {
				break
			}
			if up.count(cut) != 1 {
				t.Fatalf("%s re-executed while the gateway still answered 409", cut)
			}
			waitRetryAfter(a)
		}
		if a.status != 201 || a.replayed() || up.count(cut) != 2 {
			t.Fatalf("%s after its lease: %+v, upstream ran %d", cut, a, up.count(cut))
		}
		up.mu.Lock()
		rerun := up.times[cut][1]
		up.mu.Unlock()
		if earliest := sent[i].Add(lease); rerun.Before(earliest) {
			t.Fatalf("%s re-executed at %v, before its lease could end (%v)", cut, rerun, earliest)
		}
		if b := send("POST", gw.url("/orders"), `{}`, "Idempotency-Key", cut); !b.replayed() || up.count(cut) != 2 {
			t.Fatalf("%s third call: %+v", cut, b)
		}
	}
}

// waitRetryAfter waits as long as a 409's Retry-After says: real time,
// because the lease being waited for lives in another process's store.
func waitRetryAfter(a answer) {
	d, err := time.ParseDuration(a.header.Get("Retry-After") + "s")
	if err != nil || d <= 0 {
		d = time.Second
	}
	<-time.After(d)
}
