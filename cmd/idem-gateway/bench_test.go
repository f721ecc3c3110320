package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// The gateway benchmarks put the gateway (in process, on a loopback
// listener) in front of a trivial upstream and drive both with a Go load
// generator over keep-alive connections: gateway vs direct upstream, for
// replays and for new keys. Run:
//
//	cd cmd/idem-gateway && go test -run '^$' -bench Gateway -benchmem -benchtime 3s

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
	g, err := newGateway(o, store, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: g.handler}
	go srv.Serve(ln)
	b.Cleanup(func() { _ = srv.Close(); _ = closeStore() })
	return "http://" + ln.Addr().String()
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
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("direct/c=%d", c), func(b *testing.B) {
			benchkit.Run(b, c, func(i int) error { return post(upstream, "k") })
		})
	}
	// The ceiling: a plain reverse proxy with no idempotency at all.
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("plain-proxy/c=%d", c), func(b *testing.B) {
			up, _ := url.Parse(upstream)
			rp := httputil.NewSingleHostReverseProxy(up)
			rp.BufferPool = bufferPool{}
			rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256}
			srv := httptest.NewServer(rp)
			defer srv.Close()
			benchkit.Run(b, c, func(i int) error { return post(srv.URL, "k") })
		})
	}
	for _, s := range stores {
		for _, c := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/replay/c=%d", s.name, c), func(b *testing.B) {
				gw := serveGateway(b, upstream, s.url(b))
				const keys = 64
				for k := range keys {
					if err := post(gw, fmt.Sprintf("r%d", k)); err != nil {
						b.Fatal(err)
					}
				}
				benchkit.Run(b, c, func(i int) error { return post(gw, fmt.Sprintf("r%d", i%keys)) })
			})
			b.Run(fmt.Sprintf("%s/new/c=%d", s.name, c), func(b *testing.B) {
				gw := serveGateway(b, upstream, s.url(b))
				benchkit.Run(b, c, func(i int) error { return post(gw, fmt.Sprintf("n%d", i)) })
			})
		}
	}
}
