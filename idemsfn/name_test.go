package idemsfn_test

import (
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemsfn"
)

// checkName fails t unless name is a valid Step Functions execution name
// made of the characters ExecutionName promises.
func checkName(t *testing.T, key idem.StoreKey, name string) {
	t.Helper()
	if len(name) == 0 || len(name) > idemsfn.MaxExecutionNameLen {
		t.Fatalf("%s: name %q has %d characters", key, name, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			t.Fatalf("%s: name %q has %q", key, name, c)
		}
	}
	i := strings.LastIndexByte(name, '-')
	if hx := name[i+1:]; len(hx) < 48 || strings.Trim(hx, "0123456789abcdef") != "" {
		t.Fatalf("%s: name %q does not end in at least 48 hex digits", key, name)
	}
	if again := idemsfn.ExecutionName(key); again != name {
		t.Fatalf("%s: %q then %q", key, name, again)
	}
}

func TestExecutionName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("op.v1:x-", 16)[:idem.MaxOperationLen]
	seen := map[string]string{}
	for _, op := range []string{"orders", "o", "orders.v2:eu-west_1", long} {
		for _, tenant := range []string{"", "acme", "acme/eu", strings.Repeat("t", idem.MaxTenantLen)} {
			for _, material := range []string{"", "k1", "k2"} {
				key, err := idem.NewStoreKey(op, tenant, []byte(material))
				if err != nil {
					t.Fatal(err)
				}
				name := idemsfn.ExecutionName(key)
				checkName(t, key, name)
				if prev, ok := seen[name]; ok {
					t.Fatalf("%s and %s share the name %s", prev, key, name)
				}
				seen[name] = key.String()
			}
		}
	}
	// The tenant is in the name: the digest alone would not tell them apart.
	a, _ := idem.NewStoreKey("orders", "acme", []byte("k"))
	b, _ := idem.NewStoreKey("orders", "other", []byte("k"))
	if a.Digest != b.Digest || idemsfn.ExecutionName(a) == idemsfn.ExecutionName(b) {
		t.Errorf("tenants share a name: %s", idemsfn.ExecutionName(a))
	}
	k, _ := idem.NewStoreKey("orders.v2:eu", "", []byte("k"))
	if got := idemsfn.ExecutionName(k); !strings.HasPrefix(got, "orders_v2_eu-") || len(got) != len("orders_v2_eu-")+64 {
		t.Errorf("name %s", got)
	}
	k, _ = idem.NewStoreKey(long, "", []byte("k"))
	if got := idemsfn.ExecutionName(k); len(got) != idemsfn.MaxExecutionNameLen || !strings.HasPrefix(got, "op_v1_x-op_v1_x-op_v1_x-op_v1_x-") {
		t.Errorf("long operation: %s", got)
	}
}

func FuzzExecutionName(f *testing.F) {
	f.Add("orders", "", []byte("k"))
	f.Add("a.b:c-d_e", "tenant/eu", []byte{0, 1, 2})
	f.Add(strings.Repeat("x", 128), strings.Repeat("t", 256), []byte(""))
	f.Fuzz(func(t *testing.T, op, tenant string, material []byte) {
		key, err := idem.NewStoreKey(op, tenant, material)
		if err != nil {
			return
		}
		name := idemsfn.ExecutionName(key)
		checkName(t, key, name)
		parsed, err := idem.ParseStoreKey(key.String())
		if err != nil {
			t.Fatal(err)
		}
		if idemsfn.ExecutionName(parsed) != name {
			t.Fatalf("parsed key %s gives another name", parsed)
		}
		// Another tenant, or other material, gives another name.
		other, err := idem.NewStoreKey(op, tenant+"x", material)
		if err == nil && idemsfn.ExecutionName(other) == name {
			t.Fatalf("%s and %s share %s", key, other, name)
		}
		other, _ = idem.NewStoreKey(op, tenant, append(material, 'x'))
		if idemsfn.ExecutionName(other) == name {
			t.Fatalf("%s and %s share %s", key, other, name)
		}
	})
}
