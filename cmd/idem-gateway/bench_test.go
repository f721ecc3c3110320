//go:build unix

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// The gateway benchmarks put the gateway (in process, on a loopback
// listener, with the command's own http.Server settings) in front of a
// trivial upstream and drive it with a Go load generator over keep-alive
// connections, beside the same load sent straight to the upstream and
// through a plain httputil.ReverseProxy (no idempotency), at the same
// concurrencies: replays and new keys on each store. Run (docs/benchmarks.md):
//
//	cd cmd/idem-gateway && go test -run '^$' -bench Gateway -benchmem -benchtime 2s
//
// -bench 'Gateway/c=16/' picks one concurrency, -bench
// 'Gateway/c=16/(direct|plain-proxy|memory)' a subset; the Redis cases are
// skipped when Redis cannot be reached (IDEM_REDIS_ADDR, default
// 127.0.0.1:6379).

// benchConcurrency are the numbers of requests in flight every case runs at.
var benchConcurrency = []int{1, 16, 64}

var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256}}

func trivialUpstream(b *testing.B) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1","status":"created"}`)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// serveGateway starts an in-process gateway over storeURL and returns its
// base URL.
func serveGateway(b *testing.B, upstream, storeURL string) string {
	o, err := parseFlags([]string{"-upstream", upstream, "-store", storeURL}, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	store, closeStore, err := openStore(b.Context(), o.store)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = closeStore() })
	log := slog.New(slog.DiscardHandler)
	g, err := newGateway(o, store, log)
	if err != nil {
		b.Fatal(err)
	}
	return serve(b, o.server(g.handler, log))
}

// benchEngine returns an engine over storeURL configured as the gateway's
// (its defaults, its codec).
func benchEngine(b *testing.B, storeURL string) *idem.Engine {
	o, err := parseFlags([]string{"-upstream", "http://127.0.0.1:1", "-store", storeURL}, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	store, closeStore, err := openStore(b.Context(), o.store)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = closeStore() })
	eng, err := idem.New(store, engineConfig(o, slog.New(slog.DiscardHandler), newMetrics().observer))
	if err != nil {
		b.Fatal(err)
	}
	return eng
}

func post(url, key string) error {
	req, err := http.NewRequest("POST", url+"/orders", strings.NewReader(`{"item":"book","qty":1}`))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := benchClient.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func BenchmarkGateway(b *testing.B) {
	upstream := trivialUpstream(b)
	stores := []struct {
		name string
		url  func(b *testing.B) string
	}{
		{"memory", func(*testing.B) string { return "memory:" }},
		{"bolt", func(b *testing.B) string { return "bolt://" + b.TempDir() + "/gw.db" }},
		{"redis", func(b *testing.B) string {
			addr := testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			return fmt.Sprintf("redis://%s/0?prefix=gwbench-%d:", addr, time.Now().UnixNano())
		}},
	}
	// Interleaved, so that a change in the machine's load hits every path
	// alike: at each concurrency, direct, plain proxy, then each store.
	for _, c := range benchConcurrency {
		b.Run(fmt.Sprintf("c=%d/direct", c), func(b *testing.B) {
			runLoad(b, c, func(i int) error { return post(upstream, "k") })
		})
		// The ceiling: a plain reverse proxy with no idempotency at all,
		// with the gateway's server and transport settings.
		b.Run(fmt.Sprintf("c=%d/plain-proxy", c), func(b *testing.B) {
			px := plainProxy(b, upstream)
			runLoad(b, c, func(i int) error { return post(px, "k") })
		})
		for _, s := range stores {
			b.Run(fmt.Sprintf("c=%d/%s/replay", c, s.name), func(b *testing.B) {
				gw := serveGateway(b, upstream, s.url(b))
				const keys = 64
				for k := range keys {
					if err := post(gw, fmt.Sprintf("r%d", k)); err != nil {
						b.Fatal(err)
					}
				}
				runLoad(b, c, func(i int) error { return post(gw, "r"+strconv.Itoa(i%keys)) })
			})
			b.Run(fmt.Sprintf("c=%d/%s/new", c, s.name), func(b *testing.B) {
				gw := serveGateway(b, upstream, s.url(b))
				runLoad(b, c, func(i int) error { return post(gw, "n"+strconv.Itoa(i)) })
			})
			// The store's ceiling: the gateway's engine alone on the same
			// store, no HTTP, storing the response the gateway stores.
			b.Run(fmt.Sprintf("c=%d/%s/engine-new", c, s.name), func(b *testing.B) {
				eng := benchEngine(b, s.url(b))
				resp := idemhttp.Response{Status: http.StatusCreated,
					Header: http.Header{"Content-Type": {"application/json"}},
					Body:   []byte(`{"id":"ord_1","status":"created"}`)}
				runLoad(b, c, func(i int) error {
					_, err := idem.Do(context.Background(), eng, idem.Request{Operation: scope, Key: "e" + strconv.Itoa(i), Payload: []byte(`{}`)},
						func(context.Context) (idemhttp.Response, error) { return resp, nil })
					return err
				})
			})
		}
	}
}

// runLoad is benchkit.Run, which reports ops/s and latency percentiles,
// plus the CPU time the process (load generator, proxy or gateway, and
// upstream; not a Redis server) spent per request, in µs: a figure that
// depends much less than throughput on what else the machine runs.
func runLoad(b *testing.B, concurrency int, op func(i int) error) {
	redis := strings.Contains(b.Name(), "/redis/")
	var redisBefore time.Duration
	if redis {
		redisBefore = redisCPU(b)
	}
	before := cpuTime(b)
	benchkit.Run(b, concurrency, op)
	b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
	if redis {
		b.ReportMetric(float64((redisCPU(b)-redisBefore).Microseconds())/float64(b.N), "redis-cpu-µs/op")
	}
}

// redisCPU returns the CPU time the Redis server has used (INFO cpu).
func redisCPU(b *testing.B) time.Duration {
	addr := testenv.Reach(b, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "INFO cpu\r\n"); err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		b.Fatalf("INFO cpu: %q, %v", head, err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(string(body), "\r\n") {
		name, v, _ := strings.Cut(line, ":")
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// plainProxy serves an httputil.ReverseProxy to upstream, with the
// gateway's transport and server settings, and returns its base URL.
func plainProxy(b *testing.B, upstream string) string {
	o, err := parseFlags([]string{"-upstream", upstream}, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	up, _ := url.Parse(upstream)
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.BufferPool = bufferPool{}
	rp.Transport = upstreamTransport(o)
	return serve(b, o.server(rp, slog.New(slog.DiscardHandler)))
}

// serve serves srv on a loopback listener until the benchmark ends and
// returns its base URL.
func serve(b *testing.B, srv *http.Server) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
