// The workers of batches: goroutines that run the items of DoBatch, reused
// from item to item and from batch to batch while batches run, instead of
// a goroutine per item.

package idem

import "sync"

// workers is the engine's set of goroutines for batches. A task goes to a
// worker that is idle, or to a new one; a worker that finished its task
// waits for the next as long as a batch of the engine runs, and ends when
// none does, so an engine at rest keeps no goroutine (there is no Close).
// While batches follow each other (a consumer's), their workers are the
// same goroutines, whose stacks have grown once.
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
	quit chan struct{} // closed when the last batch of the generation ends
	mu   sync.Mutex
	idle []chan task // the idle workers' inboxes (each buffered, 1)
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
		close(w.gen.quit)
		w.gen = nil
	}
}

// run runs f on an idle worker of g, or on a new one. wg (Added to by
// the caller) is done once the worker is idle again, so that a batch that
// waited for its tasks finds their workers idle for the next.
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
	g.mu.Unlock()
	go g.work(make(chan task, 1), t)
}

// work runs t, then the tasks handed to it through in, until g ends.
func (g *gen) work(in chan task, t task) {
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
			return
		}
	}
}
