package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// The support engineer: the client sent POST /orders with
// Idempotency-Key "order-42" as acme. From that alone the record is found
// — by the gateway's own console over its bolt file (which nothing else
// can open while it runs), and by the console and by `idemctl find
// -gateway` over a shared Redis — through clientkey, which the gateway
// keys its records with.
func TestRecordIsFoundFromWhatTheClientSent(t *testing.T) {
	t.Parallel()
	sent := func(t *testing.T, gw *proc) {
		t.Helper()
		if a := send("POST", gw.url("/orders"), `{"item":"book"}`, "Idempotency-Key", `"order-42"`, "X-Account", "acme"); a.status != 201 {
			t.Fatalf("a request through the gateway: %+v", a)
		}
	}
	materials := []clientkey.Material{ // the header as sent, and the key in it
		{Kind: clientkey.KindGateway, Method: "POST", Route: "/orders", Principal: "acme", Key: `"order-42"`},
		{Kind: clientkey.KindGateway, Method: "POST", Route: "/orders", Principal: "acme", Key: "order-42"},
	}
	t.Run("bolt, the gateway's console", func(t *testing.T) {
		t.Parallel()
		up := newUpstream(t)
		gw := startGateway(t, "-upstream", up.srv.URL, "-store", "bolt://"+filepath.Join(t.TempDir(), "gw.db"),
			"-principal-header", "X-Account", "-admin", "127.0.0.1:0", "-console")
		sent(t, gw)
		c := consoletest.NewClient(t, "http://"+gw.admin+consolePath)
		defer c.HTTP.CloseIdleConnections()
		for _, m := range materials {
			c.Find(m)
		}
	})
	t.Run("redis, idemctl find", func(t *testing.T) {
		t.Parallel()
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		url := fmt.Sprintf("redis://%s/0?prefix=gwfind-%d:", addr, time.Now().UnixNano())
		up := newUpstream(t)
		gw := startGateway(t, "-upstream", up.srv.URL, "-store", url, "-principal-header", "X-Account", "-admin", "127.0.0.1:0", "-console")
		sent(t, gw)
		c := consoletest.NewClient(t, "http://"+gw.admin+consolePath)
		defer c.HTTP.CloseIdleConnections()
		ctl := idemctl(t)
		for _, m := range materials {
			key := c.Find(m)
			out := ctl.must(t, "-store", url, "find", "-gateway", "-method", m.Method, "-route", m.Route, "-principal", m.Principal, "-key", m.Key)
			if !strings.Contains(out, key) || !strings.Contains(out, "COMPLETED") {
				t.Fatalf("idemctl find -gateway -key %s: want the record of %s:\n%s", m.Key, key, out)
			}
		}
	})
}
