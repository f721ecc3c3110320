package command

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

// post sends POST route with Idempotency-Key key as principal through
// idemhttp under operation, on the fixture's store.
func (f *fixture) post(operation, route, principal, key string) {
	f.t.Helper()
	mw, err := idemhttp.New(f.app, &idemhttp.Config{Operation: operation, Principal: func(r *http.Request) (string, error) {
		return r.Header.Get("X-Account"), nil
	}})
	if err != nil {
		f.t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodPost, route, strings.NewReader(`{}`))
	r.Header.Set(idemhttp.HeaderName, key)
	if principal != "" {
		r.Header.Set("X-Account", principal)
	}
	w := httptest.NewRecorder()
	mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })).ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		f.t.Fatalf("POST %s: %d %s", route, w.Code, w.Body)
	}
}

// A support engineer has what the client sent; find derives the store key
// as the adapter did and shows the record. Each kind's records are made
// the way its adapter makes them: idemhttp itself (for the gateway too,
// with the gateway's operation), and for the message and JSON kinds the
// engine's own derivation from an idem.Request (what idemnats, idemamqp,
// idemsfn and idemlambda hand it). The adapters in modules of their own
// find their records through clientkey and the console in their tests.
func TestFind(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.post("orders", "/orders", "acme", `"order-42"`)
	f.post(clientkey.GatewayOperation, "/orders", "", `order-43`)
	run := func(req idem.Request) idem.StoreKey {
		t.Helper()
		id, err := req.Identity()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := idem.DoIdentity(ctx, f.app, id, func(context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
		return id.StoreKey
	}
	msg := run(idem.Request{Operation: "deliveries", Key: "msg-7", Payload: []byte("body"), RawPayload: true})
	sqs := run(idem.Request{Operation: "sqs-orders", Payload: []byte(`"059f36b4-87a3-44ab-83d2-661975830a7d"`)})
	// idemkafka's and idemwatermill's default: the payload, as sent, under its topic.
	payload := "{\"order\": 42}\n"
	kafka := run(idem.Request{Operation: "shipments", Tenant: "orders.v1", Payload: []byte(payload), RawPayload: true})
	recordKey := run(idem.Request{Operation: "shipments", Tenant: "orders.v1", Key: "customer-7", Payload: []byte("x"), RawPayload: true})
	rpcKey, err := clientkey.RPC("shop.v1.Orders.Create", "acme", "k-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.DoIdentity(ctx, f.app, idem.Identity{StoreKey: rpcKey}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}

	for name, c := range map[string]struct {
		args []string
		want string // the store key's scope, or the key
	}{
		"http, the header as sent":   {[]string{"-http", "-operation", "orders", "-method", "POST", "-route", "/orders", "-principal", "acme", "-key", `"order-42"`}, "orders/"},
		"http, the key in it":        {[]string{"-http", "-operation", "orders", "-method", "POST", "-route", "/orders", "-principal", "acme", "-key", `order-42`}, "orders/"},
		"gateway":                    {[]string{"-gateway", "-method", "POST", "-route", "/orders", "-key", `"order-43"`}, "gateway#"},
		"grpc, from the method name": {[]string{"-grpc", "-method", "/shop.v1.Orders/Create", "-principal", "acme", "-key", "k-1"}, rpcKey.String()},
		"message id":                 {[]string{"-message", "-operation", "deliveries", "-key", "msg-7"}, msg.String()},
		"json, sqs message id":       {[]string{"-json", "-operation", "sqs-orders", "-key", `"059f36b4-87a3-44ab-83d2-661975830a7d"`}, sqs.String()},
		"payload under its topic":    {[]string{"-payload", "-operation", "shipments", "-topic", "orders.v1", "-key", payload}, kafka.String()},
		"record key under its topic": {[]string{"-message", "-operation", "shipments", "-topic", "orders.v1", "-key", "customer-7"}, recordKey.String()},
	} {
		t.Run(name, func(t *testing.T) {
			out := f.must(append([]string{"find"}, c.args...)...)
			if !strings.Contains(out, "status:") || !strings.Contains(out, "COMPLETED") || !strings.Contains(out, c.want) {
				t.Fatalf("find %v:\n%s", c.args, out)
			}
		})
	}
	var v view
	if err := json.Unmarshal([]byte(f.must("find", "-o", "json", "-message", "-operation", "deliveries", "-key", "msg-7")), &v); err != nil || v.Key != msg.String() {
		t.Fatalf("find -o json: %+v %v", v, err)
	}
	// A payload that is binary, or long, comes from stdin.
	f.stdin = payload
	if out := f.must("find", "-payload", "-operation", "shipments", "-topic", "orders.v1", "-key", "-"); !strings.Contains(out, kafka.String()) {
		t.Fatalf("find -payload -key -:\n%s", out)
	}
	f.stdin = ""

	// The operator: the header value through show finds nothing;
	// through find, a wrong route says which store key it looked for.
	if code, _, _ := f.run("show", "--scope", "orders", "--key", `"order-42"`); code != ExitNotFound {
		t.Fatalf("show --key of a header value: exit %d", code)
	}
	code, out, errOut := f.run("find", "-http", "-operation", "orders", "-method", "POST", "-route", "/order", "-principal", "acme", "-key", "order-42")
	if code != ExitNotFound || out != "" || !strings.Contains(errOut, "no such record") || !strings.Contains(errOut, "orders/") {
		t.Fatalf("find of an absent key: exit %d %q %q", code, out, errOut)
	}
}

func TestFindUsageErrors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for args, want := range map[string]string{
		"find -key k":                                              "give one of -http",
		"find -http -grpc -key k":                                  "not -http and -grpc",
		"find -message -operation o -key k extra":                  "find takes flags only",
		"find -http -operation o -method POST -key k":              "route: missing",
		"find -http -operation o -method post -route /o -key k":    "upper case",
		"find -grpc -method Create -key k":                         "not a full method name",
		"find -message -key k":                                     "operation: missing",
		"find -json -operation o -key order-42":                    "invalid JSON",
		"find -payload -operation o -tenant t -key x":              "give the topic instead",
		"find -payload -operation o -topic t -key -":               "key: missing",
		"find -gateway -method POST -route /o -key \"unterminated": "missing closing quote",
	} {
		code, _, errOut := f.run(strings.Fields(args)...)
		if code != ExitUsage || !strings.Contains(errOut, want) {
			t.Errorf("%s: exit %d, stderr %q; want %q", args, code, errOut, want)
		}
	}
}
