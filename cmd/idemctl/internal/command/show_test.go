package command

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestShow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	keys := population(f)

	out := f.must("show", keys["stuck"].String())
	for _, want := range []string{"status:", "IN_PROGRESS (stuck: past its expected completion)", "owner:", "worker-7/", "execution ref:", "arn:aws:states:exec:a", "age:", "2m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	out = f.must("show", "--scope", "refund", "--key", "c")
	if !strings.Contains(out, "error code:") || !strings.Contains(out, "declined") || !strings.Contains(out, "card declined") {
		t.Errorf("show failed record:\n%s", out)
	}
	var v view
	if err := json.Unmarshal([]byte(f.must("show", "-o", "json", "--scope", "charge", "--tenant", "t1", "--key", "d")), &v); err != nil {
		t.Fatal(err)
	}
	var result struct{ ID int }
	if err := json.Unmarshal(v.Result, &result); err != nil || result.ID != 7 {
		t.Fatalf("result %s: %v", v.Result, err)
	}
	if v.Status != "COMPLETED" || v.Key != keys["completed"].String() {
		t.Fatalf("%+v", v)
	}
	if f.must("show", "--scope", "charge/t1", "--key", "d") != f.must("show", keys["completed"].String()) {
		t.Fatal("--scope NAME/TENANT and the store key differ")
	}
	code, out, errOut := f.run("show", "--scope", "charge", "--key", "nope")
	if code != ExitNotFound || out != "" || !strings.Contains(errOut, "no such record") {
		t.Fatalf("absent key: exit %d, %q %q", code, out, errOut)
	}
}
