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
		"kafka record value (the default)": {clientkey.Material{Kind: clientkey.KindPayload, Operation: "orders", Topic: "orders.v1", Key: `{"b":1, "a":"x"}`},
			"orders/orders.v1#" + sum(`{"b":1, "a":"x"}`)},
		"watermill payload outside a router": {clientkey.Material{Kind: clientkey.KindPayload, Operation: "orders", Key: "order 42"},
			"orders#" + sum("order 42")},
		"payload of a topic that cannot be a tenant": {clientkey.Material{Kind: clientkey.KindPayload, Operation: "orders", Topic: "orders #1", Key: "x"},
			"orders/sha256:" + sum("orders #1")[:32] + "#" + sum("x")},
		"kafka record key": {clientkey.Material{Kind: clientkey.KindKey, Operation: "orders", Topic: "orders.v1", Key: "customer-7"},
			"orders/orders.v1#" + sum("customer-7")},
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
	fid, err := clientkey.HTTPIdentity("orders", clientkey.HTTPTenant("p"), "PUT", "/x", "k", fp)
	eq(fid.StoreKey, err, clientkey.Material{Kind: clientkey.KindHTTP, Operation: "orders", Principal: "p", Method: "PUT", Route: "/x", Key: "k"})
	if fid.Fingerprint != hex.EncodeToString(fp[:]) {
		t.Fatalf("HTTPIdentity's fingerprint %q", fid.Fingerprint)
	}
	for _, f := range []*[sha256.Size]byte{nil, &fp} {
		kid, err := clientkey.KeyIdentity("orders", clientkey.TopicTenant("t.v1"), "k", f)
		eq(kid.StoreKey, err, clientkey.Material{Kind: clientkey.KindKey, Operation: "orders", Topic: "t.v1", Key: "k"})
		jid, err2 := clientkey.JSONIdentity("orders", "t", []byte(`{"b":1,"a":2}`), f)
		eq(jid.StoreKey, err2, clientkey.Material{Kind: clientkey.KindJSON, Operation: "orders", Tenant: "t", Key: `{"a":2,"b":1}`})
		want := ""
		if f != nil {
			want = hex.EncodeToString(f[:])
		}
		if kid.Fingerprint != want || jid.Fingerprint != want {
			t.Fatalf("fingerprints %q, %q; want %q", kid.Fingerprint, jid.Fingerprint, want)
		}
	}
	pid, err := clientkey.PayloadIdentity("orders", "t.v1", []byte(`{"b":1}`))
	eq(pid.StoreKey, err, clientkey.Material{Kind: clientkey.KindPayload, Operation: "orders", Topic: "t.v1", Key: `{"b":1}`})
	if pid.Fingerprint != sum(`{"b":1}`) || pid.StoreKey.Digest != pid.Fingerprint {
		t.Fatalf("PayloadIdentity's fingerprint %q, want the payload's digest", pid.Fingerprint)
	}
	// The identity of a key or payload is the root's (idem.Request's).
	rid2, _ := (&idem.Request{Operation: "orders", Tenant: "t.v1", Key: "k", Payload: []byte(`{"b":1}`), RawPayload: true}).Identity()
	fp2 := sha256.Sum256([]byte(`{"b":1}`))
	if kid, _ := clientkey.KeyIdentity("orders", "t.v1", "k", &fp2); kid != rid2 {
		t.Fatalf("KeyIdentity %+v, idem.Request.Identity %+v", kid, rid2)
	}
	if rid3, _ := (&idem.Request{Operation: "orders", Tenant: "t.v1", Payload: []byte(`{"b":1}`), RawPayload: true}).Identity(); pid != rid3 {
		t.Fatalf("PayloadIdentity %+v, idem.Request.Identity %+v", pid, rid3)
	}
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
		{clientkey.Material{Kind: clientkey.KindKey, Operation: "o", Tenant: "t", Topic: "t", Key: "k"}, "topic"},
		{clientkey.Material{Kind: clientkey.KindPayload, Operation: "o", Topic: "t"}, "key"},
		{clientkey.Material{Kind: clientkey.KindPayload, Operation: "o", Tenant: "t", Key: "x"}, "tenant"},
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
		{Kind: clientkey.KindPayload, Operation: "bad op", Key: "x"},
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

// A topic scopes a key as it is when it may be a tenant (every Kafka
// topic name may), and by its digest when it may not.
func TestTopicTenant(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("t", idem.MaxTenantLen+1)
	for topic, want := range map[string]string{
		"":                       "",
		"orders.v1":              "orders.v1",
		"orders/eu":              "orders/eu",
		"orders_eu-1":            "orders_eu-1",
		"orders #1":              "sha256:" + sum("orders #1")[:32],
		"orders\x00":             "sha256:" + sum("orders\x00")[:32],
		"ordén":                  "sha256:" + sum("ordén")[:32],
		long:                     "sha256:" + sum(long)[:32],
		long[:idem.MaxTenantLen]: long[:idem.MaxTenantLen],
	} {
		if got := clientkey.TopicTenant(topic); got != want {
			t.Errorf("TopicTenant(%q) = %q, want %q", topic, got, want)
		}
		if _, err := idem.NewStoreKey("o", clientkey.TopicTenant(topic), nil); err != nil {
			t.Errorf("TopicTenant(%q) is no tenant: %v", topic, err)
		}
	}
	if _, err := clientkey.PayloadIdentity("o", "t", nil); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("an empty payload: %v, want idem.ErrInvalidKey", err)
	}
}
