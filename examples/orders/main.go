// Command orders is the example service that make demo puts behind
// idem-gateway: a small order API that is not idempotent at all. Every POST
// /orders creates a new order; run it behind the gateway and retries with an
// Idempotency-Key create one.
//
//	go run ./examples/orders -listen 127.0.0.1:9000
//
//	POST /orders            {"item":"book","qty":1} → 201, Location /orders/ord_1
//	POST /orders?delay=5s   the same, answered after 5s (to see a 409)
//	GET  /orders/{id}       → 200 or 404
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"
)

type order struct {
	ID        string    `json:"id"`
	Item      string    `json:"item"`
	Qty       int       `json:"qty"`
	CreatedAt time.Time `json:"created_at"`
}

// service keeps orders in memory.
type service struct {
	mu     sync.Mutex
	orders map[string]order
	next   int
	log    *slog.Logger
}

func newService(log *slog.Logger) *service {
	return &service{orders: map[string]order{}, log: log}
}

func (s *service) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.create)
	mux.HandleFunc("GET /orders/{id}", s.get)
	return mux
}

func (s *service) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Item string `json:"item"`
		Qty  int    `json:"qty"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Item == "" || in.Qty <= 0 {
		http.Error(w, `want {"item":"…","qty":n} with qty > 0`, http.StatusBadRequest)
		return
	}
	if d := r.URL.Query().Get("delay"); d != "" {
		delay, err := time.ParseDuration(d)
		if err != nil || delay < 0 || delay > time.Minute {
			http.Error(w, "delay: want a duration up to 1m, such as 5s", http.StatusBadRequest)
			return
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	s.mu.Lock()
	s.next++
	o := order{ID: fmt.Sprintf("ord_%d", s.next), Item: in.Item, Qty: in.Qty, CreatedAt: time.Now().UTC()}
	s.orders[o.ID] = o
	s.mu.Unlock()
	s.log.Info("order created", "id", o.ID, "item", o.Item, "qty", o.Qty)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+o.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(o)
}

func (s *service) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	o, ok := s.orders[r.PathValue("id")]
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(o)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stdout, nil))
	log.Info("orders service listening", "addr", *listen)
	srv := &http.Server{Addr: *listen, Handler: newService(log).routes(), ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}
