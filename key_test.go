package idem_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
)

func TestKeyFormat(t *testing.T) {
	t.Parallel()
	k, err := idem.NewStoreKey("charge", "acme", []byte("order-42"))
	if err != nil {
		t.Fatal(err)
	}
	s := k.String()
	if !strings.HasPrefix(s, "charge/acme#") || len(s) != len("charge/acme#")+64 {
		t.Fatalf("key %q", s)
	}
	back, err := idem.ParseStoreKey(s)
	if err != nil || back != k {
		t.Fatalf("ParseKey(%q) = %+v %v", s, back, err)
	}
	other, _ := idem.NewStoreKey("charge", "globex", []byte("order-42"))
	if other.String() == s {
		t.Fatal("two tenants share a key")
	}
}

func TestKeyValidation(t *testing.T) {
	t.Parallel()
	bad := []struct{ name, tenant string }{
		{"", ""},
		{"has space", ""},
		{"has#hash", ""},
		{strings.Repeat("a", 129), ""},
		{"ok", "ten ant"},
		{"ok", "ten#ant"},
		{"ok", strings.Repeat("t", 257)},
	}
	for _, b := range bad {
		_, err := idem.NewStoreKey(b.name, b.tenant, []byte("x"))
		var ke *idem.KeyError
		if !errors.Is(err, idem.ErrInvalidKey) || !errors.As(err, &ke) {
			t.Errorf("NewKey(%q, %q): %v, want *KeyError", b.name, b.tenant, err)
		}
	}
	for _, s := range []string{"", "charge", "charge#abc", "charge/#" + strings.Repeat("a", 64), "charge#" + strings.Repeat("A", 64)} {
		if _, err := idem.ParseStoreKey(s); !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("ParseKey(%q): %v, want ErrInvalidKey", s, err)
		}
	}
	r := idem.Request{Operation: "s", Key: strings.Repeat("k", idem.MaxKeyLen+1)}
	if _, err := r.Identity(); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("oversized key: %v", err)
	}
	r = idem.Request{Operation: "s"}
	if _, err := r.Identity(); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("no key and no payload: %v", err)
	}
}

func TestIdentity(t *testing.T) {
	t.Parallel()
	a := idem.Request{Operation: "s", Key: "k", Payload: []byte(`{"x":1,"y":2}`)}
	b := idem.Request{Operation: "s", Key: "k", Payload: []byte(`{ "y":2, "x":1 }`)}
	c := idem.Request{Operation: "s", Key: "k", Payload: []byte(`{ "y":2, "x":1 }`), RawPayload: true}
	ia, _ := a.Identity()
	ib, _ := b.Identity()
	ic, _ := c.Identity()
	if ia != ib {
		t.Fatalf("key order changed the identity: %+v %+v", ia, ib)
	}
	if ic.StoreKey != ia.StoreKey || ic.Fingerprint == ia.Fingerprint {
		t.Fatalf("raw mode: %+v vs %+v", ic, ia)
	}
	d := idem.Request{Operation: "s", Payload: []byte(`{"x":1,"y":2}`)}
	id, err := d.Identity()
	if err != nil || id.StoreKey.Digest != id.Fingerprint {
		t.Fatalf("payload-derived key: %+v %v", id, err)
	}
	if _, err := (&idem.Request{Operation: "s", Key: "k", Payload: []byte(`{"x":1,"x":2}`)}).Identity(); !errors.Is(err, idem.ErrInvalidPayload) {
		t.Fatalf("duplicate-key payload: %v", err)
	}
}

func FuzzParseStoreKey(f *testing.F) {
	k, _ := idem.NewStoreKey("charge", "acme", []byte("x"))
	f.Add(k.String())
	f.Add("a#" + strings.Repeat("0", 64))
	f.Add("a/b/c#" + strings.Repeat("f", 64))
	f.Add("#")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := idem.ParseStoreKey(s)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("ParseKey(%q) error %v is not ErrInvalidKey", s, err)
			}
			return
		}
		if k.String() != s {
			t.Fatalf("ParseKey(%q).String() = %q", s, k.String())
		}
		if again, err := idem.NewStoreKey(k.Operation, k.Tenant, []byte("m")); err != nil || again.Scope() != k.Scope() {
			t.Fatalf("parsed scope %q does not validate: %v", k.Scope(), err)
		}
	})
}

// NewIdentity derives the store key NewStoreKey derives and the hex of the
// fingerprint given; Request.Identity derives the same for a key and a
// payload, and for a payload alone a key whose digest is the fingerprint.
func TestNewIdentity(t *testing.T) {
	t.Parallel()
	fp := sha256.Sum256([]byte("request"))
	for _, tenant := range []string{"", "acme"} {
		id, err := idem.NewIdentity("charge", tenant, []byte("order-42"), fp)
		if err != nil {
			t.Fatal(err)
		}
		k, err := idem.NewStoreKey("charge", tenant, []byte("order-42"))
		if err != nil {
			t.Fatal(err)
		}
		if id.StoreKey != k || id.StoreKey.String() != k.String() || id.Fingerprint != hex.EncodeToString(fp[:]) {
			t.Errorf("tenant %q: NewIdentity = %+v %q, want %+v %x", tenant, id.StoreKey, id.Fingerprint, k, fp)
		}
		if back, err := idem.ParseStoreKey(id.StoreKey.String()); err != nil || back != k {
			t.Errorf("tenant %q: ParseStoreKey(%q) = %+v %v", tenant, id.StoreKey.String(), back, err)
		}
	}
	if _, err := idem.NewIdentity("has space", "", []byte("k"), fp); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("bad operation: %v, want ErrInvalidKey", err)
	}
	if _, err := idem.NewIdentity("charge", "ten#ant", []byte("k"), fp); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("bad tenant: %v, want ErrInvalidKey", err)
	}

	payload := []byte(`{"b":1, "a":2}`)
	canon := sha256.Sum256([]byte(`{"a":2,"b":1}`))
	r := idem.Request{Operation: "charge", Tenant: "acme", Key: "order-42", Payload: payload}
	id, err := r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := idem.NewStoreKey("charge", "acme", []byte("order-42"))
	if id.StoreKey != k || id.Fingerprint != hex.EncodeToString(canon[:]) {
		t.Errorf("key and payload: %+v %q", id.StoreKey, id.Fingerprint)
	}
	r = idem.Request{Operation: "charge", Payload: payload}
	id, err = r.Identity()
	if err != nil {
		t.Fatal(err)
	}
	if id.Fingerprint != hex.EncodeToString(canon[:]) || id.StoreKey.String() != "charge#"+id.Fingerprint {
		t.Errorf("payload alone: %q %q", id.StoreKey.String(), id.Fingerprint)
	}
	r = idem.Request{Operation: "charge", Key: "order-42"}
	k, _ = idem.NewStoreKey("charge", "", []byte("order-42"))
	if id, err = r.Identity(); err != nil || id.StoreKey != k || id.Fingerprint != "" {
		t.Errorf("key alone: %+v %q %v", id.StoreKey, id.Fingerprint, err)
	}
}
