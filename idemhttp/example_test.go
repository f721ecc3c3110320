package idemhttp_test

import (
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
