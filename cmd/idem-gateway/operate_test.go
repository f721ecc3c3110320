package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seed-a1b882c0/idem/idemtest/clockskew"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/monitor"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// The operators' story, on every store that outlives a process: a gateway
// SIGKILLed while a request is at the upstream leaves its claim
// IN_PROGRESS. Once the lease has passed, `idemctl list --stuck` and one
// sweep of the monitor find it; `idemctl resolve` settles it by hand; the
// client's retry through a new gateway gets the resolved response,
// replayed, and the upstream is not called again.
func TestKilledGatewaysStuckKeyIsFoundAndResolved(t *testing.T) {
	stamp := time.Now().UnixNano()
	kinds := []struct {
		name string
		// gateway is the gateway's -store; tool the same store for
		// idemctl and the monitor, which open it passively.
		gateway, tool func(t *testing.T) string
	}{
		{"bolt", func(t *testing.T) string { return "bolt://" + filepath.Join(t.TempDir(), "gw.db") }, nil},
		{"redis", func(t *testing.T) string {
			addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
			return fmt.Sprintf("redis://%s/0?prefix=gwoperate-%d:", addr, stamp)
		}, nil},
		{"postgres", func(t *testing.T) string {
			addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
			return fmt.Sprintf("postgres://%s@%s/test?table=gwoperate_%d", pgUser(), addr, stamp)
		}, nil},
		{"dynamodb", func(t *testing.T) string {
			return dynamoURL(t, stamp) + "&create=true"
		}, func(t *testing.T) string { return dynamoURL(t, stamp) }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			gwURL := k.gateway(t)
			toolURL := gwURL
			if k.tool != nil {
				toolURL = k.tool(t)
			}
			operate(t, gwURL, toolURL)
		})
	}
}

func dynamoURL(t *testing.T, stamp int64) string {
	ep := testenv.DynamoDB(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "local")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "local")
	return fmt.Sprintf("dynamodb://gwoperate_%d?region=us-east-1&endpoint=%s", stamp, ep)
}

func operate(t *testing.T, gwURL, toolURL string) {
	const lease = 2 * time.Second
	up := newUpstream(t)
	release := up.holdAll()
	defer release()
	args := []string{"-upstream", up.srv.URL, "-store", gwURL, "-lease", lease.String(), "-cache-entries", "0"}

	gw := startGateway(t, args...)
	killedAt := time.Now()
	go send("POST", gw.url("/orders"), `{"item":"book"}`, "Idempotency-Key", "stuck-1")
	if k := <-up.arrived; k != "stuck-1" {
		t.Fatalf("upstream got %q", k)
	}
	gw.kill()
	release()
	// The dead gateway's lease lives in the store: wait it out. The lease
	// ends on the store's clock, which the gateway read with a
	// measurement's error, and idemctl and the monitor decide "stuck" on
	// the store's clock too, read with an error of their own: on Redis
	// and PostgreSQL both are a round trip's, on DynamoDB half a second
	// each (its Date header tells whole seconds). clockskew.Slack covers
	// the two.
	time.Sleep(time.Until(killedAt.Add(lease + clockskew.Slack)))

	ctl := idemctl(t)
	out := ctl.must(t, "-store", toolURL, "list", "--stuck", "-o", "json")
	var page struct {
		Records []struct {
			Key    string `json:"key"`
			Status string `json:"status"`
			Stuck  bool   `json:"stuck"`
			Owner  string `json:"owner"`
		} `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Records) != 1 || !page.Records[0].Stuck || page.Records[0].Owner == "" {
		t.Fatalf("idemctl list --stuck: %v\n%s", err, out)
	}
	key := page.Records[0].Key

	ctx := context.Background()
	st, err := storeurl.Open(ctx, toolURL, &storeurl.Options{Passive: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := monitor.New(st.Lister(), &monitor.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := m.Sweep(ctx)
	_ = m.Close()
	_ = st.Close()
	if err != nil || snap.Stuck != 1 || snap.InProgress != 1 {
		t.Fatalf("one monitor sweep: %+v, %v; want 1 stuck of 1 in progress", snap, err)
	}

	// The operator learns from the upstream's logs that the order was
	// made, and records its response by hand.
	resolved := fmt.Sprintf(`{"status":201,"header":{"Content-Type":["application/json"]},"body":%q}`,
		base64.StdEncoding.EncodeToString([]byte(`{"id":"ord_resolved"}`)))
	file := filepath.Join(t.TempDir(), "resolved.json")
	if err := os.WriteFile(file, []byte(resolved), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl.must(t, "-store", toolURL, "resolve", key, "--result", "@"+file, "--yes")
	if out := ctl.must(t, "-store", toolURL, "list", "--stuck", "-o", "json"); strings.Contains(out, key) {
		t.Fatalf("still stuck after resolve:\n%s", out)
	}

	gw = startGateway(t, args...)
	a := send("POST", gw.url("/orders"), `{"item":"book"}`, "Idempotency-Key", "stuck-1")
	if a.status != 201 || !a.replayed() || a.body != `{"id":"ord_resolved"}` {
		t.Fatalf("the client's retry after resolve: %+v\n%s", a, gw.logs)
	}
	if n := up.count("stuck-1"); n != 1 {
		t.Fatalf("the upstream ran the resolved key %d times", n)
	}
}

// ctlBinary is idemctl, built once for the tests that run it.
type ctlBinary string

var (
	ctlOnce sync.Once
	ctlPath string
	ctlErr  error
)

func idemctl(t *testing.T) ctlBinary {
	t.Helper()
	ctlOnce.Do(func() {
		ctlPath = filepath.Join(filepath.Dir(binary), "idemctl")
		out, err := exec.Command("go", "build", "-o", ctlPath, "../idemctl").CombinedOutput()
		if err != nil {
			ctlErr = fmt.Errorf("building idemctl: %v\n%s", err, out)
		}
	})
	if ctlErr != nil {
		t.Fatal(ctlErr)
	}
	return ctlBinary(ctlPath)
}

// must runs idemctl with args and returns its standard output; any other
// exit than 0 fails the test.
func (c ctlBinary) must(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(string(c), args...)
	cmd.Stdin = nil
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("idemctl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}
