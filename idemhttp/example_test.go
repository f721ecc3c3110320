package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/store/memstore"
)

// The middleware around a handler: a retried POST with the same
// Idempotency-Key gets the first response again, marked as a replay, and
// the handler runs once; the key sent with another body is refused.
func ExampleMiddleware_Handler() {
	store := memstore.New(nil)
	defer store.Close()
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	mw, err := idemhttp.New(eng, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	orders := 0
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":"ord_%d"}`, orders)
	})
	srv := httptest.NewServer(mw.Handler(createOrder))
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
		req.Header.Set(idemhttp.HeaderName, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 400 { // refused, with an RFC 9457 problem as the body
			fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type"))
			return
		}
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.ReplayedHeader), b)
	}
	post("7f3c", `{"sku":"book","qty":1}`)
	post("7f3c", `{"sku":"book","qty":1}`) // a retry
	post("7f3c", `{"sku":"book","qty":2}`) // the key reused for another request
	fmt.Println("orders:", orders)
	// Output:
	// 201 replayed="" {"order":"ord_1"}
	// 201 replayed="true" {"order":"ord_1"}
	// 422 application/problem+json
	// orders: 1
}

// A handler that accepts work: it answers 202 with the Location of a
// status resource and hands the claim's token to a worker, which completes
// the key later. A retry during the work gets 202 and the status; a retry
// after it, the worker's response.
func ExampleAccept() {
	store := memstore.New(nil)
	defer store.Close()
	eng, err := idem.New(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	mw, err := idemhttp.New(eng, &idemhttp.Config{StatusPath: "/idempotency/status/"})
	if err != nil {
		fmt.Println(err)
		return
	}
	jobs := make(chan string, 1)
	transfer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, err := idemhttp.Accept(w, r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		jobs <- tok.String() // the worker's queue
		w.WriteHeader(http.StatusAccepted)
	})
	srv := httptest.NewServer(mw.Handler(transfer))
	defer srv.Close()

	post := func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/transfers", strings.NewReader(`{"amount":10}`))
		req.Header.Set(idemhttp.HeaderName, "t-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		loc := resp.Header.Get("Location")
		fmt.Printf("%d status-resource=%t replayed=%q", resp.StatusCode, strings.HasPrefix(loc, "/idempotency/status/"), resp.Header.Get(idemhttp.ReplayedHeader))
		if resp.StatusCode == http.StatusAccepted && len(b) > 0 {
			var s idemhttp.StatusResource
			_ = json.Unmarshal(b, &s)
			fmt.Printf(" %s", s.Status)
		} else if len(b) > 0 {
			fmt.Printf(" %s", b)
		}
		fmt.Println()
	}
	post() // accepted
	post() // a retry during the work

	// The worker, possibly in another process.
	err = mw.Complete(context.Background(), <-jobs, idemhttp.Response{Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"transfer":"tr_1"}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	post() // a retry after the work
	// Output:
	// 202 status-resource=true replayed=""
	// 202 status-resource=true replayed="" IN_PROGRESS
	// 201 status-resource=false replayed="true" {"transfer":"tr_1"}
}
