package clientkey_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
)

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// The store keys of released versions must not change: a record made
// before an upgrade must be found, replayed and settled after it. These
// are the keys each adapter has made since its first release, written out
// from their documented material.
func TestStoreKeysStayAsReleased(t *testing.T) {
	t.Parallel()
	acmeHTTP := sum("idemhttp-principal\x00acme")[:32]
	acmeRPC := sum("idemrpc-principal\x00acme")[:32]
	for name, c := range map[string]struct {
		m    clientkey.Material
		want string
	}{
		"http": {clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Method: "POST", Route: "/orders", Key: `"order-42"`},
			"orders#" + sum("POST\x00/orders\x00order-42")},
		"http, idemhttp's default operation": {clientkey.Material{Kind: clientkey.KindHTTP, Method: "POST", Route: "/orders", Key: `order-42`},
			"http#" + sum("POST\x00/orders\x00order-42")},
		"http, the header unquoted": {clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Method: "POST", Route: "/orders", Key: `order-42`},
			"orders#" + sum("POST\x00/orders\x00order-42")},
		"http, an escape": {clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Method: "POST", Route: "/orders", Key: ` "a\"b" `},
			"orders#" + sum("POST\x00/orders\x00a\"b")},
		"http with a principal": {clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Method: "POST", Route: "/orders", Principal: "acme", Key: "order-42"},
			"orders/" + acmeHTTP + "#" + sum("POST\x00/orders\x00order-42")},
		"gateway": {clientkey.Material{Kind: clientkey.KindGateway, Method: "POST", Route: "/orders", Principal: "acme", Key: `"order-42"`},
			"gateway/d481cb7cb8960dc489e851a8b62d3ae5#c1b585399400cda0a7d456a78df190ada27732122c4622b6f099f0bb58b3c2f3"},
		"grpc": {clientkey.Material{Kind: clientkey.KindRPC, Method: "/shop.v1.Orders/Create", Principal: "acme", Key: "order-42"},
			"shop.v1.Orders.Create/" + acmeRPC + "#" + sum("order-42")},
		"grpc with an operation": {clientkey.Material{Kind: clientkey.KindRPC, Operation: "create-order", Key: "order-42"},
			"create-order#" + sum("order-42")},
		"message id": {clientkey.Material{Kind: clientkey.KindKey, Operation: "orders", Key: "msg-42"},
			"orders#22ca0cc9586a0c8e0644939617f12c52235f038faea1543fdfa1384e4570f361"},
		"explicit key with a tenant": {clientkey.Material{Kind: clientkey.KindKey, Operation: "orders", Tenant: "acme", Key: "msg-42"},
			"orders/acme#" + sum("msg-42")},
		"json, canonicalised": {clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Key: `{"b":1, "a":"x"}`},
			"orders#" + sum(`{"a":"x","b":1}`)},
		"sqs message id": {clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Key: `"059f36b4-87a3-44ab-83d2-661975830a7d"`},
			"orders#" + sum(`"059f36b4-87a3-44ab-83d2-661975830a7d"`)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k, err := c.m.StoreKey()
			if err != nil || k.String() != c.want {
				t.Fatalf("%+v: %q %v, want %q", c.m, k.String(), err, c.want)
			}
		})
	}
	if sum("idemhttp-principal\x00acme")[:32] != "d481cb7cb8960dc489e851a8b62d3ae5" {
		t.Fatal("the gateway's principal hash changed")
	}
}

// The functions the adapters call and the Material the commands build
// are one rule.
func TestFunctionsAreTheMaterialRule(t *testing.T) {
	t.Parallel()
	eq := func(a idem.StoreKey, err error, m clientkey.Material) {
		t.Helper()
		b, err2 := m.StoreKey()
		if err != nil || err2 != nil || a.String() != b.String() {
			t.Fatalf("%v %v / %v %v", a, err, b, err2)
		}
	}
	k, err := clientkey.HTTP("orders", "p", "PUT", "/x", "k")
	eq(k, err, clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Principal: "p", Method: "PUT", Route: "/x", Key: "k"})
	k, err = clientkey.HTTPWithTenant(clientkey.GatewayOperation, clientkey.HTTPTenant("p"), "PUT", "/x", "k")
	eq(k, err, clientkey.Material{Kind: clientkey.KindGateway, Principal: "p", Method: "PUT", Route: "/x", Key: "k"})
	k, err = clientkey.RPCWithTenant("a.B.C", clientkey.RPCTenant("p"), "k")
	eq(k, err, clientkey.Material{Kind: clientkey.KindRPC, Method: "/a.B/C", Principal: "p", Key: "k"})
	fp := sha256.Sum256([]byte("request"))
	rid, err := clientkey.RPCIdentity("a.B.C", clientkey.RPCTenant("p"), "k", fp)
	eq(rid.StoreKey, err, clientkey.Material{Kind: clientkey.KindRPC, Method: "/a.B/C", Principal: "p", Key: "k"})
	if rid.Fingerprint != hex.EncodeToString(fp[:]) {
		t.Fatalf("RPCIdentity's fingerprint %q", rid.Fingerprint)
	}
	id, err := (&idem.Request{Operation: "orders", Tenant: "t", Key: "k"}).Identity()
	eq(id.StoreKey, err, clientkey.Material{Kind: clientkey.KindKey, Operation: "orders", Tenant: "t", Key: "k"})
	id, err = (&idem.Request{Operation: "orders", Payload: []byte(`[1, 2]`)}).Identity()
	eq(id.StoreKey, err, clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Key: `[1,2]`})
	if clientkey.HTTPTenant("") != "" || clientkey.RPCTenant("") != "" || clientkey.HTTPTenant("p") == clientkey.RPCTenant("p") {
		t.Fatal("tenants of principals")
	}
}

func TestMaterialErrorsNameThePart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		m     clientkey.Material
		field string
	}{
		{clientkey.Material{}, "kind"},
		{clientkey.Material{Kind: "smtp", Key: "k"}, "kind"},
		{clientkey.Material{Kind: clientkey.KindHTTP, Operation: "o", Route: "/o", Key: "k"}, "method"},
		{clientkey.Material{Kind: clientkey.KindHTTP, Operation: "o", Method: "post", Route: "/o", Key: "k"}, "method"},
		{clientkey.Material{Kind: clientkey.KindGateway, Method: "POST", Key: "k"}, "route"},
		{clientkey.Material{Kind: clientkey.KindGateway, Operation: "orders", Method: "POST", Route: "/o", Key: "k"}, "operation"},
		{clientkey.Material{Kind: clientkey.KindGateway, Method: "POST", Route: "/o"}, "key"},
		{clientkey.Material{Kind: clientkey.KindRPC, Key: "k"}, "method"},
		{clientkey.Material{Kind: clientkey.KindRPC, Method: "Create", Key: "k"}, "method"},
		{clientkey.Material{Kind: clientkey.KindRPC, Method: "/a.B/C"}, "key"},
		{clientkey.Material{Kind: clientkey.KindKey, Key: "k"}, "operation"},
		{clientkey.Material{Kind: clientkey.KindJSON, Operation: "o"}, "key"},
	} {
		_, err := c.m.StoreKey()
		var me *clientkey.MaterialError
		if !errors.As(err, &me) || me.Field != c.field || !strings.Contains(err.Error(), c.field) || !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("%+v: %v, want a MaterialError naming %s", c.m, err, c.field)
		}
	}
	// What the adapter would refuse, refused with the adapter's error.
	for _, m := range []clientkey.Material{
		{Kind: clientkey.KindKey, Operation: "bad op", Key: "k"},
		{Kind: clientkey.KindKey, Operation: "o", Key: strings.Repeat("k", idem.MaxKeyLen+1)},
		{Kind: clientkey.KindHTTP, Operation: "o#", Method: "POST", Route: "/", Key: "k"},
	} {
		if _, err := m.StoreKey(); !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("%+v: %v, want idem.ErrInvalidKey", m, err)
		}
	}
	var ke *idem.KeyError
	if _, err := (clientkey.Material{Kind: clientkey.KindGateway, Method: "POST", Route: "/o", Key: `"order-42`}).StoreKey(); !errors.As(err, &ke) || ke.Field != clientkey.HeaderField || !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("an unterminated header value: %v, want an idem.KeyError about the header", err)
	}
	if _, err := (clientkey.Material{Kind: clientkey.KindJSON, Operation: "o", Key: "order-42"}).StoreKey(); !errors.Is(err, idem.ErrInvalidPayload) {
		t.Errorf("json that is none: %v, want idem.ErrInvalidPayload", err)
	}
}
