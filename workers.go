// The workers of batches: goroutines that run the items of DoBatch, reused
// from item to item and from batch to batch, instead of a goroutine per
// item — the engine's own, alive while its batches run, and those of a
// context from WithBatchWorkers, alive until it is stopped.

package idem

import (
	"context"
	"sync"
)

// workers is the engine's set of goroutines for batches. A task goes to a
// worker that is idle, or to a new one; a worker that finished its task
// waits for the next as long as a batch of the engine runs, and ends when
// none does, so an engine at rest keeps no goroutine (there is no Close).
// While batches overlap, their workers are the same goroutines, whose
// stacks have grown once; a consumer whose batches follow each other
// keeps its workers with [WithBatchWorkers].
//
// The workers of one period of activity (from the first batch to start to
// the last to end) share one generation: its tasks channel and its quit
// channel, made by the batch that starts it, so that a batch run inside a
// testing/synctest bubble uses channels of that bubble.
type workers struct {
	mu     sync.Mutex
	active int  // batches running
	gen    *gen // the current generation, while active > 0
}

// gen is one generation of workers.
type gen struct {
	quit   chan struct{} // closed when the generation ends
	mu     sync.Mutex
	idle   []chan task    // the idle workers' inboxes (each buffered, 1)
	ended  bool           // quit is closed: no new worker
	living sync.WaitGroup // the generation's workers
}

// task is a function for a worker, and the WaitGroup it is done in.
type task struct {
	f  func()
	wg *sync.WaitGroup
}

// enter marks a batch running and returns the generation its tasks go to.
func (w *workers) enter() *gen {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.active == 0 {
		w.gen = &gen{quit: make(chan struct{})}
	}
	w.active++
	return w.gen
}

// leave marks a batch ended; the last one ends its generation's idle
// workers.
func (w *workers) leave() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.active--
	if w.active == 0 {
		w.gen.end()
		w.gen = nil
	}
}

// end ends g: its idle workers return, the busy ones once their task is
// done, and no new worker starts.
func (g *gen) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.ended {
		g.ended = true
		close(g.quit)
	}
}

// run runs f on an idle worker of g, or on a new one. wg (Added to by
// the caller) is done once the worker is idle again, so that a batch that
// waited for its tasks finds their workers idle for the next. Once g has
// ended and no worker is idle, f runs on a goroutine of its own.
func (g *gen) run(f func(), wg *sync.WaitGroup) {
	t := task{f: f, wg: wg}
	g.mu.Lock()
	if n := len(g.idle); n > 0 {
		in := g.idle[n-1]
		g.idle = g.idle[:n-1]
		g.mu.Unlock()
		in <- t
		return
	}
	if g.ended {
		g.mu.Unlock()
		go func() { defer wg.Done(); f() }()
		return
	}
	g.living.Add(1)
	g.mu.Unlock()
	go g.work(make(chan task, 1), t)
}

// work runs t, then the tasks handed to it through in, until g ends.
func (g *gen) work(in chan task, t task) {
	defer g.living.Done()
	idle := false
	defer func() {
		if !idle { // t.f ended the goroutine (runtime.Goexit)
			t.wg.Done()
		}
	}()
	for {
		idle = false
		t.f()
		g.mu.Lock()
		g.idle = append(g.idle, in)
		g.mu.Unlock()
		idle = true
		t.wg.Done()
		select {
		case t = <-in:
		case <-g.quit:
			if g.leaveIdle(in) {
				return
			}
			t = <-in // a batch took this worker before it could leave
		}
	}
}

// leaveIdle takes the worker of inbox in off the idle list, reporting
// whether it was there: if not, a task is on its way to it.
func (g *gen) leaveIdle(in chan task) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, c := range g.idle {
		if c == in {
			g.idle = append(g.idle[:i], g.idle[i+1:]...)
			return true
		}
	}
	return false
}

// WithBatchWorkers returns ctx carrying workers for the batches run with
// it ([DoBatch]), which outlive each batch, where the engine's own end
// whenever no batch of the engine runs; stop ends them and waits for them
// to return. A consumer loop that runs one batch after another
// (idemnats.ConsumeBatch, idemamqp's RunBatch) calls it when it starts,
// runs every batch with the context and calls stop when it ends, so its
// workers start once and their stacks grow once.
//
// No goroutine starts and no timer is set until a batch needs a worker,
// and each worker waits only for its next task or for stop: call it where
// the batches run — inside a testing/synctest bubble, in the bubble — and
// call stop before that ends. The workers may serve any number of engines
// and of batches at once; a batch run with the context after stop still
// runs, on goroutines of its own. stop may be called more than once.
func WithBatchWorkers(ctx context.Context) (_ context.Context, stop func()) {
	r := &batchWorkers{g: &gen{quit: make(chan struct{})}}
	return context.WithValue(ctx, workersKey{}, r), r.close
}

// batchWorkers are the workers of a context from [WithBatchWorkers].
type batchWorkers struct {
	g *gen
}

// close ends the workers and waits for them to return.
func (r *batchWorkers) close() {
	r.g.end()
	r.g.living.Wait()
}

type workersKey struct{}

// batchRunner is the workers of a batch: ctx's, or nil.
func batchRunner(ctx context.Context) *batchWorkers {
	r, _ := ctx.Value(workersKey{}).(*batchWorkers)
	return r
}
