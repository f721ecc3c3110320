package main

import (
	"path/filepath"
	"testing"

	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
)

// The support engineer: the client sent POST /orders with
// Idempotency-Key "order-42" as acme. From that alone the gateway's own
// console (over its bolt file, which nothing else can open while it runs)
// finds the record, through clientkey, which the gateway keys its records
// with and idemctl find -gateway uses too.
func TestConsoleFindsTheRecordFromWhatTheClientSent(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	gw := startGateway(t, "-upstream", up.srv.URL, "-store", "bolt://"+filepath.Join(t.TempDir(), "gw.db"),
		"-principal-header", "X-Account", "-admin", "127.0.0.1:0", "-console")
	if a := send("POST", gw.url("/orders"), `{"item":"book"}`, "Idempotency-Key", `"order-42"`, "X-Account", "acme"); a.status != 201 {
		t.Fatalf("a request through the gateway: %+v", a)
	}
	c := consoletest.NewClient(t, "http://"+gw.admin+consolePath)
	defer c.HTTP.CloseIdleConnections()
	for _, key := range []string{`"order-42"`, "order-42"} {
		c.Find(clientkey.Material{Kind: clientkey.KindGateway, Method: "POST", Route: "/orders", Principal: "acme", Key: key})
	}
}
