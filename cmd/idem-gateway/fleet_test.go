package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/faultproxy"
	"github.com/seed-a1b882c0/idem/idemtest/redisnodes"
)

// The fleet's load and chaos.
const (
	fleetKeys    = 600             // each sent 3 to 5 times
	fleetWorkers = 8               // keys in flight at once
	fleetKills   = 8               // SIGKILLs per store, each mid-request
	fleetLease   = 2 * time.Second // -lease: takeovers happen within the test
	// fleetMaxLatency bounds the latency a fault adds to the store's
	// requests.
	fleetMaxLatency = 30 * time.Millisecond
	sendBudget      = 15 * time.Second
	sendMaxTries    = 40
	// -store-wait: every other restarted gateway starts with its path to
	// the store down, back up within a second or so.
	fleetStoreWait = 30 * time.Second
	attemptHeader  = "X-Fleet-Attempt"
)

// TestFleetUnderStoreFaultsAndKills runs three gateway processes on one
// store (Redis, then PostgreSQL), each reaching it through its own fault
// proxy (latency, windows of connection resets, lost replies), while
// fleetKeys keys are each sent 3 to 5 times to random gateways, some sends
// at once, and a random gateway is killed (SIGKILL, at a moment it is
// passing a request upstream) and restarted every few dozen executions.
//
// On the Redis Cluster (every write waiting for a replica), a master is
// also SIGKILLed half way through the load: its replica takes over, and the
// killed node is started again and rejoins as a replica. A holder cut off
// from the store by the failover for longer than its lease loses its key,
// as the lease rule says, so a key running then may run once more, and the
// cut-off holder still answers with its own run's response (its outcome
// write is refused; docs/library.md's complete_failed case): one more body.
//
// Per key: the upstream ran it at most once, plus once for every kill of a
// gateway while the key was in flight there; no run started before the
// previous run's claim could have lost its lease; every 2xx answer carries
// one and the same body, which the upstream produced. Every other restart
// happens while that gateway's path to the store is down: it must wait
// (-store-wait), answering 503, and serve once the path is back.
func TestFleetUnderStoreFaultsAndKills(t *testing.T) {
	for _, kind := range []string{"redis", "redis-cluster", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			addr, via := sharedStore(t, kind)
			f := newFleet(t, addr, via)
			if kind == "redis-cluster" {
				f.midway = f.failoverMaster
			}
			f.run()
			f.check()
		})
	}
}

// fleet is one run: three gateway slots, the upstream, and what happened.
type fleet struct {
	t     *testing.T
	up    *upstream
	store string   // -store URL straight to the server, for the final listing
	args  []string // gateway flags but -store
	start time.Time

	victims chan *fleetKill // the upstream hands the main loop a victim

	mu       sync.Mutex
	slots    []*fleetSlot
	attempts map[int64]*attempt
	lastID   int64
	execs    []execution
	kills    []*fleetKill
	armed    *fleetKill // the next kill, once len(execs) reaches killAt
	killAt   int
	healed   bool // faults are off (the final sweep)
	faults   map[string]int
	faultLog []faultEvent     // every fault set off, for a broken key's story
	gws      map[[2]int]*proc // every gateway process by slot and generation
	windows  []*time.Timer    // ends of reset windows
	gaveUp   int              // sends that ran out of budget
	dead     []*proc          // killed gateways, for their logs
	timeline []time.Time      // start of each phase: load, sweep, end
	outages  []time.Duration  // restarts with the store down: start to store open
	midway   func()           // when set, run once half the keys' executions have happened
	// failovers are the windows from a master's SIGKILL until its replica
	// serves and the killed node is back: a holder cut off from the store
	// for longer than its lease loses its key (the lease rule), so a key
	// in flight then may run once more.
	failovers [][2]time.Time
	half      chan struct{} // closed once half the keys' executions have happened
}

// fleetSlot is one gateway position: its proxy to the store and the
// process currently serving there (nil while it restarts).
type fleetSlot struct {
	px    *faultproxy.Proxy
	store string // -store URL through px
	gw    *proc
	gen   int // incremented at every restart
}

// attempt is one HTTP request of a client.
type attempt struct {
	id         int64
	key        string
	slot, gen  int
	sweep      bool
	start, end time.Time
	answer
}

// execution is one run of a key by the upstream.
type execution struct {
	key     string
	run     int64
	attempt int64
	at      time.Time
}

// fleetKill is one SIGKILL of the gateway at slot/gen.
type fleetKill struct {
	slot, gen int
	key       string    // the key its upstream request carried
	at        time.Time // just before SIGKILL
	done      chan struct{}
}

func newFleet(t *testing.T, storeAddr string, via func(string) string) *fleet {
	f := &fleet{
		t: t, up: newUpstream(t), store: via(storeAddr),
		victims: make(chan *fleetKill, 1), half: make(chan struct{}),
		attempts: map[int64]*attempt{},
		faults:   map[string]int{},
		gws:      map[[2]int]*proc{},
	}
	hook := f.onRun
	f.up.onRun.Store(&hook)
	f.args = []string{"-upstream", f.up.srv.URL, "-lease", fleetLease.String(), "-wait", "1s",
		"-upstream-timeout", "10s", "-expiry", "10m", "-store-wait", fleetStoreWait.String()}
	for range 3 {
		px, err := faultproxy.New(storeAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(px.Close)
		px.SetLatency(2 * time.Millisecond)
		s := &fleetSlot{px: px, store: via(px.Addr())}
		s.gw = startGateway(t, append(f.args, "-store", s.store)...)
		f.gws[[2]int{len(f.slots), 0}] = s.gw
		f.slots = append(f.slots, s)
	}
	return f
}

// run sends the load while killing gateways, then heals the faults and
// sends every key once more.
func (f *fleet) run() {
	f.start = time.Now()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		f.each(func(k int) {
			key, body := fleetKey(k)
			for left := 3 + rand.IntN(3); left > 0; {
				n := 1
				if rand.IntN(3) == 0 { // some sends at once
					n = min(left, 2+rand.IntN(2))
				}
				var wg sync.WaitGroup
				for range n {
					wg.Go(func() { f.send(key, body, false) })
				}
				wg.Wait()
				left -= n
			}
		})
	}()
	f.arm()
	var half <-chan struct{} // closed by onRun once half the keys' executions have happened
	if f.midway != nil {
		half = f.half
	}
	for done := false; !done; {
		select {
		case <-half:
			f.midway() // on the test's goroutine, which may fail the test
			half = nil
		case k := <-f.victims:
			f.killAndRestart(k)
			if len(f.kills) < fleetKills {
				f.arm()
			}
		case <-loaded:
			done = true
		}
	}
	f.mu.Lock()
	f.armed, f.healed = nil, true
	for _, w := range f.windows {
		w.Stop()
	}
	for _, s := range f.slots {
		s.px.ResetRequests(0)
		s.px.DropReplies(0)
		s.px.SetLatency(0)
	}
	f.timeline = append(f.timeline, time.Now())
	f.mu.Unlock()
	f.each(func(k int) {
		key, body := fleetKey(k)
		f.send(key, body, true)
	})
	f.timeline = append(f.timeline, time.Now())
}

func fleetKey(k int) (key, body string) {
	return fmt.Sprintf("fleet-%03d", k), fmt.Sprintf(`{"order":%d}`, k)
}

// each calls fn for every key index, fleetWorkers at a time.
func (f *fleet) each(fn func(k int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range fleetWorkers {
		wg.Go(func() {
			for k := range next {
				fn(k)
			}
		})
	}
	for k := range fleetKeys {
		next <- k
	}
	close(next)
	wg.Wait()
}

// send is a client: it sends key to random gateways until an answer other
// than 409, 502, 503, 504 or a connection error, within a budget.
func (f *fleet) send(key, body string, sweep bool) {
	deadline := time.Now().Add(sendBudget)
	backoff := 25 * time.Millisecond
	for range sendMaxTries {
		a := f.try(key, body, sweep)
		if !a.retryable() {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		// Real time: what the retry waits for is in another process — a
		// claim's lease, a store fault, a gateway restarting.
		<-time.After(backoff/2 + rand.N(backoff/2+1))
		backoff = min(2*backoff, 800*time.Millisecond)
	}
	f.mu.Lock()
	f.gaveUp++
	f.mu.Unlock()
}

func (a *attempt) retryable() bool {
	switch a.status {
	case http.StatusConflict, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return a.err != nil
}

// try makes one request to a random live gateway.
func (f *fleet) try(key, body string, sweep bool) *attempt {
	f.mu.Lock()
	var live []int
	for i, s := range f.slots {
		if s.gw != nil {
			live = append(live, i)
		}
	}
	i := live[rand.IntN(len(live))] // one gateway at most is down
	f.lastID++
	a := &attempt{id: f.lastID, key: key, slot: i, gen: f.slots[i].gen, sweep: sweep, start: time.Now()}
	f.attempts[a.id] = a
	url := f.slots[i].gw.url("/orders")
	f.mu.Unlock()
	ans := send("POST", url, body, "Idempotency-Key", key, attemptHeader, strconv.FormatInt(a.id, 10))
	end := time.Now()
	f.mu.Lock()
	a.answer, a.end = ans, end
	f.mu.Unlock()
	return a
}

// onRun is the upstream's arrival hook: it records the execution, kills
// the gateway that passed it when that gateway is the armed victim, sets
// off store faults for that gateway now and then, and otherwise takes a
// little while to answer so that keys overlap.
func (f *fleet) onRun(r *http.Request, key string, run int64) {
	id, _ := strconv.ParseInt(r.Header.Get(attemptHeader), 10, 64)
	f.mu.Lock()
	f.execs = append(f.execs, execution{key: key, run: run, attempt: id, at: time.Now()})
	if len(f.execs) == fleetKeys/2 {
		close(f.half)
	}
	var victim *fleetKill
	if a := f.attempts[id]; a != nil && f.slots[a.slot].gen == a.gen && f.slots[a.slot].gw != nil {
		if k := f.armed; k != nil && k.slot == a.slot && len(f.execs) >= f.killAt {
			victim, f.armed = k, nil
			k.gen, k.key = a.gen, key
			f.victims <- k
		} else if !f.healed && rand.IntN(4) == 0 {
			f.fault(a.slot)
		}
	}
	f.mu.Unlock()
	if victim != nil {
		// The gateway passing this request dies before it is answered.
		select {
		case <-victim.done:
		case <-r.Context().Done():
		}
		return
	}
	select { // the handling delay
	case <-time.After(time.Duration(2+rand.IntN(28)) * time.Millisecond):
	case <-r.Context().Done():
	}
}

// fault sets off one store fault on px; f.mu is held.
func (f *fleet) fault(slot int) {
	px := f.slots[slot].px
	kind := ""
	defer func() { f.faultLog = append(f.faultLog, faultEvent{at: time.Now(), slot: slot, kind: kind}) }()
	switch n := rand.IntN(10); {
	case n < 3:
		k := 1 + rand.IntN(3)
		px.ResetRequests(k)
		f.faults["reset bursts"]++
		kind = fmt.Sprintf("reset burst of %d requests", k)
	case n < 6:
		// Every request is reset for a moment: longer than a store
		// client's own retries last.
		px.ResetRequests(1 << 30)
		d := 50*time.Millisecond + rand.N(450*time.Millisecond)
		f.windows = append(f.windows, time.AfterFunc(d, func() { px.ResetRequests(0) }))
		f.faults["reset windows"]++
		kind = fmt.Sprintf("reset window of %v", d.Round(time.Millisecond))
	case n < 8:
		k := 1 + rand.IntN(2)
		px.DropReplies(k)
		f.faults["lost replies"]++
		kind = fmt.Sprintf("%d lost replies", k)
	default:
		d := time.Duration(rand.N(int64(fleetMaxLatency)))
		px.SetLatency(d)
		f.faults["latency changes"]++
		kind = fmt.Sprintf("latency %v", d.Round(time.Millisecond))
	}
}

// failoverMaster SIGKILLs a master of the Redis Cluster (by the PID
// scripts/redis-cluster recorded), waits until its replica serves as
// master, starts the killed node again and waits until it has rejoined as
// a linked replica.
func (f *fleet) failoverMaster() {
	addrs := clusterAddrs(f.t)
	dir := os.Getenv("IDEM_REDIS_CLUSTER_DIR")
	if dir == "" {
		f.t.Error("IDEM_REDIS_CLUSTER_DIR is not set: run the cluster with scripts/redis-cluster")
		return
	}
	masters := redisnodes.Masters(f.t, addrs[0])
	victim, replica := redisnodes.Shard(f.t, masters[rand.IntN(len(masters))])
	killed := time.Now()
	redisnodes.Kill(f.t, redisnodes.Dir(dir, victim))
	f.mu.Lock()
	f.faults["master failovers"]++
	f.mu.Unlock()
	redisnodes.WaitRole(f.t, replica, "master", time.Minute)
	redisnodes.Restart(f.t, redisnodes.Dir(dir, victim))
	redisnodes.WaitLinked(f.t, victim, time.Minute)
	f.mu.Lock()
	f.failovers = append(f.failovers, [2]time.Time{killed, time.Now()})
	f.mu.Unlock()
}

// arm picks the next victim: the gateway at a random slot, at its first
// upstream request once a share of the keys' executions has happened.
func (f *fleet) arm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = &fleetKill{slot: rand.IntN(len(f.slots)), done: make(chan struct{})}
	f.killAt = len(f.execs) + fleetKeys/(fleetKills+1)
}

// killAndRestart SIGKILLs the victim while the upstream holds its request,
// then starts a new gateway at its slot. It runs on the test's goroutine.
func (f *fleet) killAndRestart(k *fleetKill) {
	f.mu.Lock()
	s := f.slots[k.slot]
	gw := s.gw
	s.gw = nil // no new requests to it
	k.at = time.Now()
	f.kills = append(f.kills, k)
	f.dead = append(f.dead, gw)
	f.mu.Unlock()
	gw.kill()
	close(k.done)
	// The new process starts on a healthy path to the store: its startup
	// (PostgreSQL migrates) is not what is tested here.
	s.px.ResetRequests(0)
	s.px.DropReplies(0)
	s.px.SetLatency(2 * time.Millisecond)
	if len(f.kills)%2 == 1 {
		f.restartDuringOutage(s)
		return
	}
	ngw := startGateway(f.t, append(f.args, "-store", s.store)...)
	f.mu.Lock()
	s.gw, s.gen = ngw, s.gen+1
	f.gws[[2]int{slices.Index(f.slots, s), s.gen}] = ngw
	f.mu.Unlock()
}

// restartDuringOutage starts the slot's new gateway while its path to the
// store is down, and brings the path back up a moment later, within
// -store-wait: the gateway must listen at once, answer covered requests
// (the clients' sends reach it) 503 meanwhile, and serve once the store is
// back, without exiting.
func (f *fleet) restartDuringOutage(s *fleetSlot) {
	s.px.Down()
	start := time.Now()
	ngw := startListening(f.t, append(f.args, "-store", s.store)...)
	f.mu.Lock()
	s.gw, s.gen = ngw, s.gen+1
	f.gws[[2]int{slices.Index(f.slots, s), s.gen}] = ngw
	f.mu.Unlock()
	time.Sleep(200*time.Millisecond + rand.N(time.Second)) // real time: the outage the gateway waits out
	if err := s.px.Up(); err != nil {
		f.t.Fatal(err)
	}
	select {
	case <-ngw.opened:
	case err := <-ngw.done:
		ngw.done <- err
		f.t.Fatalf("gateway %d/%d, started with its store down, exited (%v) instead of waiting:\n%s", slices.Index(f.slots, s), s.gen, err, ngw.logs)
	case <-time.After(fleetStoreWait):
		f.t.Fatalf("gateway %d/%d: its store did not open within -store-wait %v of coming back:\n%s", slices.Index(f.slots, s), s.gen, fleetStoreWait, ngw.logs)
	}
	f.mu.Lock()
	f.outages = append(f.outages, time.Since(start))
	f.mu.Unlock()
}

// keyLog is what happened to one key.
type keyLog struct {
	attempts []*attempt
	execs    []execution
	kills    []*fleetKill // kills of a gateway while the key was in flight there
}

// check asserts the promises per key and logs the histograms.
func (f *fleet) check() {
	t := f.t
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := map[string]*keyLog{}
	for k := range fleetKeys {
		key, _ := fleetKey(k)
		keys[key] = &keyLog{}
	}
	statuses := map[string]int{}
	for _, id := range slices.Sorted(maps.Keys(f.attempts)) {
		a := f.attempts[id]
		kl := keys[a.key]
		kl.attempts = append(kl.attempts, a)
		statuses[a.label()]++
		if a.err == nil {
			switch a.status {
			case http.StatusCreated, http.StatusConflict, http.StatusServiceUnavailable:
			default:
				t.Errorf("%s: attempt %d at gateway %d/%d answered %d: %s", a.key, a.id, a.slot, a.gen, a.status, a.body)
			}
			continue
		}
		// A connection error is what a client of a killed gateway sees.
		var killedBy *fleetKill
		for _, k := range f.kills {
			if k.slot == a.slot && k.gen == a.gen && a.start.Before(k.at) {
				killedBy = k
			}
		}
		if killedBy == nil {
			t.Errorf("%s: attempt %d at gateway %d/%d, never killed, failed: %v", a.key, a.id, a.slot, a.gen, a.err)
		} else if !slices.Contains(kl.kills, killedBy) {
			kl.kills = append(kl.kills, killedBy)
		}
	}
	for _, e := range f.execs {
		keys[e.key].execs = append(keys[e.key].execs, e)
	}

	hist := map[string]map[int]int{"never in flight at a kill": {}, "in flight at a kill": {}}
	broken := map[string]int{} // keys by promise broken
	reruns := map[string]int{} // runs after the first, by what the run before them answered
	bad := 0
	for _, key := range slices.Sorted(maps.Keys(keys)) {
		kl := keys[key]
		slices.SortFunc(kl.execs, func(a, b execution) int { return int(a.run - b.run) })
		group := "never in flight at a kill"
		if len(kl.kills) > 0 {
			group = "in flight at a kill"
		}
		hist[group][len(kl.execs)]++
		var problems []string
		broke := func(promise, detail string) {
			if !slices.Contains(problems, detail) {
				problems = append(problems, detail)
				broken[promise]++
			}
		}
		failovers := 0
		for _, w := range f.failovers {
			// A run that started within a lease before the failover, or
			// during it, may have lost its key to it.
			if slices.ContainsFunc(kl.execs, func(e execution) bool { return e.at.After(w[0].Add(-fleetLease)) && e.at.Before(w[1]) }) {
				failovers++
			}
		}
		if allowed := 1 + len(kl.kills) + failovers; len(kl.execs) > allowed {
			broke("executions", fmt.Sprintf("executed %d times, at most %d allowed (%d kills while in flight, %d store failovers)", len(kl.execs), allowed, len(kl.kills), failovers))
		}
		for i := 1; i < len(kl.execs); i++ {
			prev := f.attempts[kl.execs[i-1].attempt]
			switch {
			case prev.err == nil && prev.status/100 == 2:
				reruns["after a 2xx answer: its outcome was not recorded"]++
			case prev.err != nil && slices.ContainsFunc(kl.kills, func(k *fleetKill) bool { return k.slot == prev.slot && k.gen == prev.gen }):
				reruns["after its gateway was killed"]++
			default:
				reruns["after "+prev.label()]++
			}
			// Store timestamps are whole milliseconds: a lease may end up
			// to 1ms before start+lease. And leases are decided on the
			// store's clock, which each gateway measures through the fault
			// proxy: a measurement is off by up to the one-way latency the
			// proxy adds (fleetMaxLatency), so two gateways may disagree by
			// twice that.
			if earliest := prev.start.Add(fleetLease - time.Millisecond - 2*fleetMaxLatency); kl.execs[i].at.Before(earliest) {
				broke("lease", fmt.Sprintf("run %d started %v before run %d's claim could have lost its lease",
					kl.execs[i].run, earliest.Sub(kl.execs[i].at), kl.execs[i-1].run))
			}
		}
		var bodies []string
		for _, a := range kl.attempts {
			if a.err != nil || a.status/100 != 2 {
				continue
			}
			if !slices.Contains(bodies, a.body) {
				bodies = append(bodies, a.body)
			}
			if !f.up.produced(key, a.body) {
				broke("produced", fmt.Sprintf("a 2xx body the upstream never produced: %s", a.body))
			}
		}
		// A holder cut off by a failover for longer than its lease still
		// answers with what its run produced (its outcome write is refused:
		// the key was taken over), so each failover the key lived through
		// may add one body. A killed gateway answers nothing: kills add none.
		switch {
		case len(bodies) == 0:
			broke("answered", "no 2xx answer at all, the final sweep included")
		case len(bodies) > 1+failovers:
			broke("one body", fmt.Sprintf("%d different 2xx bodies, at most %d allowed (%d store failovers)", len(bodies), 1+failovers, failovers))
		}
		if len(problems) == 0 {
			continue
		}
		// The first few keys with their whole story, then one line each.
		bad++
		switch {
		case bad <= 3:
			t.Errorf("%s: %s\n%s", key, strings.Join(problems, "; "), f.story(kl))
		case bad <= 30:
			t.Errorf("%s: %s", key, strings.Join(problems, "; "))
		}
	}
	if bad > 30 {
		t.Errorf("... and %d more keys", bad-30)
	}

	load, sweep := f.timeline[0].Sub(f.start), f.timeline[1].Sub(f.timeline[0])
	t.Logf("%d keys, %d attempts, %d executions in %v of load and %v of final sweep; %d keys broke a promise: %v",
		fleetKeys, len(f.attempts), len(f.execs), load.Round(time.Millisecond), sweep.Round(time.Millisecond), bad, broken)
	for _, g := range []string{"never in flight at a kill", "in flight at a kill"} {
		t.Logf("executions per key, %s: %s", g, histogram(hist[g]))
	}
	t.Logf("runs after the first, by what the previous run's request got: %v", reruns)
	var ks []string
	for _, k := range f.kills {
		ks = append(ks, fmt.Sprintf("%v gw%d/%d (%s)", k.at.Sub(f.start).Round(time.Millisecond), k.slot, k.gen, k.key))
	}
	t.Logf("%d kills: %s", len(f.kills), strings.Join(ks, ", "))
	var os []string
	for _, d := range f.outages {
		os = append(os, d.Round(time.Millisecond).String())
	}
	t.Logf("%d restarts with the store down at their start, each from start to store open: %s", len(f.outages), strings.Join(os, ", "))
	if want := (len(f.kills) + 1) / 2; len(f.outages) != want {
		t.Errorf("%d restarts with the store down, want %d", len(f.outages), want)
	}
	var resets, dropped int64
	for _, s := range f.slots {
		resets += s.px.Reset.Load()
		dropped += s.px.Dropped.Load()
	}
	t.Logf("faults: %v; store requests reset %d, store replies lost %d", f.faults, resets, dropped)
	t.Logf("answers: %v; sends out of budget %d", statuses, f.gaveUp)
	t.Logf("gateway warnings and errors: %v", f.gatewayLogs())
	t.Logf("store records at the end: %v", f.storeStatuses())
}

// label names an answer for the counts: status and problem type, or the
// connection error.
func (a *attempt) label() string {
	switch {
	case a.err != nil:
		return "conn-error"
	case a.replayed():
		return strconv.Itoa(a.status) + "-replayed"
	case a.problemType() != "":
		return strconv.Itoa(a.status) + "-" + a.problemType()
	}
	return strconv.Itoa(a.status)
}

// story tells what happened to one key, for a failure message.
func (f *fleet) story(kl *keyLog) string {
	var b strings.Builder
	for _, e := range kl.execs {
		a := f.attempts[e.attempt]
		fmt.Fprintf(&b, "  run %d at %v by attempt %d (gw%d/%d, sent at %v)\n", e.run, f.since(e.at), e.attempt, a.slot, a.gen, f.since(a.start))
	}
	for _, a := range kl.attempts {
		fmt.Fprintf(&b, "  attempt %d gw%d/%d %v..%v: %s %s\n", a.id, a.slot, a.gen, f.since(a.start), f.since(a.end), a.label(), strings.TrimSpace(a.body))
	}
	for _, k := range kl.kills {
		fmt.Fprintf(&b, "  kill of gw%d/%d at %v\n", k.slot, k.gen, f.since(k.at))
	}
	// For each run but the last: the faults set off on its gateway's path
	// to the store, and every warning that gateway logged, from the run
	// until its attempt was answered (was the whole path cut off, or the
	// key alone?).
	for _, e := range kl.execs[:max(len(kl.execs)-1, 0)] {
		a := f.attempts[e.attempt]
		from, to := e.at.Add(-fleetLease), a.end.Add(100*time.Millisecond)
		for _, fe := range f.faultLog {
			if fe.slot == a.slot && fe.at.After(from) && fe.at.Before(to) {
				fmt.Fprintf(&b, "  fault on gw%d's path at %v: %s\n", a.slot, f.since(fe.at), fe.kind)
			}
		}
		p := f.gws[[2]int{a.slot, a.gen}]
		if p == nil {
			continue
		}
		// The gateway logs the store's key (a digest), not the
		// Idempotency-Key: every write and renewal it retried is listed,
		// and the claims it could not make are counted.
		n, refused := 0, 0
		for line := range strings.Lines(p.logs.String()) {
			var rec struct {
				Time       time.Time
				Level, Msg string
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Level == "INFO" || rec.Time.Before(e.at) || rec.Time.After(to) {
				continue
			}
			if rec.Msg == "idemhttp: request refused" {
				refused++
				continue
			}
			if n++; n <= 60 {
				fmt.Fprintf(&b, "  gw%d/%d at %v: %.300s\n", a.slot, a.gen, f.since(rec.Time), strings.TrimSpace(line))
			}
		}
		fmt.Fprintf(&b, "  gw%d/%d from run %d until its answer: %d warnings (%d listed), %d requests refused\n", a.slot, a.gen, e.run, n, min(n, 60), refused)
	}
	return b.String()
}

// faultEvent is one fault set off on a slot's path to the store.
type faultEvent struct {
	at   time.Time
	slot int
	kind string
}

// procs is every gateway process of the run, killed ones included.
func (f *fleet) procs() []*proc {
	procs := slices.Clone(f.dead)
	for _, s := range f.slots {
		if s.gw != nil {
			procs = append(procs, s.gw)
		}
	}
	return procs
}

func (f *fleet) since(at time.Time) time.Duration { return at.Sub(f.start).Round(time.Millisecond) }

func histogram(h map[int]int) string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, fmt.Sprintf("%d run(s): %d keys", n, h[n]))
	}
	return strings.Join(parts, ", ")
}

// gatewayLogs counts the warnings and errors every gateway process logged,
// killed ones included, by message.
func (f *fleet) gatewayLogs() map[string]int {
	out := map[string]int{}
	for _, p := range f.procs() {
		sc := bufio.NewScanner(strings.NewReader(p.logs.String()))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rec struct{ Level, Msg string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && (rec.Level == "WARN" || rec.Level == "ERROR") {
				out[rec.Level+" "+rec.Msg]++
			}
		}
	}
	return out
}

// storeStatuses counts the store's records by status, read straight from
// the server.
func (f *fleet) storeStatuses() map[string]int {
	s, closeStore, err := openStore(context.Background(), f.store)
	if err != nil {
		f.t.Errorf("opening the store: %v", err)
		return nil
	}
	defer closeStore()
	out := map[string]int{}
	for _, r := range listRecords(f.t, s) {
		out[r.Status.String()]++
	}
	return out
}
