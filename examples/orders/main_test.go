package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestOrdersAreNotIdempotentOnTheirOwn(t *testing.T) {
	srv := httptest.NewServer(newService(slog.New(slog.DiscardHandler)).routes())
	defer srv.Close()
	post := func(body string) (int, string, string) {
		resp, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location"), string(b)
	}
	_, loc1, _ := post(`{"item":"book","qty":1}`)
	code, loc2, body := post(`{"item":"book","qty":1}`)
	if code != 201 || loc1 != "/orders/ord_1" || loc2 != "/orders/ord_2" || !strings.Contains(body, `"id":"ord_2"`) {
		t.Fatalf("second post: %d %s %s", code, loc2, body)
	}
	if code, _, _ := post(`{"item":""}`); code != 400 {
		t.Fatalf("bad order: %d", code)
	}
	resp, err := http.Get(srv.URL + loc1)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("get %s: %d", loc1, resp.StatusCode)
	}
}
