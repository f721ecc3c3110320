package storeurl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// The step kill scenario: a process runs a three-step operation (charge,
// email, ledger) over a networked store, is SIGKILLed after its second
// step was recorded, and another process resumes the operation once the
// dead holder's lease has passed: charge and email are not run again,
// ledger runs once, and a later call replays the result.

// stepKillLease is the lease of every engine of the scenario: a dead
// holder's claim is taken over this long after its last renewal.
const stepKillLease = time.Second

// The environment of a child of the scenario.
const (
	envStepKillRole    = "IDEM_STEPKILL_ROLE"    // "do": idem.Do, "http": an idemhttp server
	envStepKillStore   = "IDEM_STEPKILL_STORE"   // the store URL
	envStepKillEffects = "IDEM_STEPKILL_EFFECTS" // the file the steps' effects are appended to
	envStepKillKey     = "IDEM_STEPKILL_KEY"     // the key (role "do")
	envStepKillBlock   = "IDEM_STEPKILL_BLOCK"   // "1": block after the email step, to be killed
)

const (
	stepKillOperation = "place-order"
	stepKillPayload   = `{"cents":500}`
	// stepsRecorded is the child's line once Step "email" returned: both
	// steps are recorded.
	stepsRecorded = "STEPS RECORDED"
)

// orderReceipt is the operation's result: each step's value, and who ran
// each (the process id).
type orderReceipt struct {
	ChargeID  string
	MessageID string
	Entry     string
}

// effect appends "name pid" to the effects file: the step's effect, which
// must happen once.
func effect(file, name string) (string, error) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return "", err
	}
	v := name + " " + strconv.Itoa(os.Getpid())
	if _, err := f.WriteString(v + "\n"); err != nil {
		f.Close()
		return "", err
	}
	return v, f.Close()
}

// placeOrder is the operation: three steps, each an effect on the file;
// with block, it says stepsRecorded after the second and never returns.
func placeOrder(ctx context.Context, file string, block bool) (orderReceipt, error) {
	var r orderReceipt
	var err error
	step := func(name string) (string, error) {
		return idem.Step(ctx, name, func(context.Context) (string, error) { return effect(file, name) })
	}
	if r.ChargeID, err = step("charge"); err != nil {
		return r, err
	}
	if r.MessageID, err = step("email"); err != nil {
		return r, err
	}
	if block {
		fmt.Println(stepsRecorded)
		select {} // killed here
	}
	if r.Entry, err = step("ledger"); err != nil {
		return r, err
	}
	return r, nil
}

// effects reads the effects file: each step's lines ("name pid").
func effects(t *testing.T, file string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for line := range strings.Lines(string(b)) {
		name, _, _ := strings.Cut(line, " ")
		out[name] = append(out[name], strings.TrimSpace(line))
	}
	return out
}

func stepKillEngine(t testing.TB, raw, owner string) *idem.Engine {
	t.Helper()
	s, err := storeurl.Open(context.Background(), raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e, err := idem.New(s.Store, &idem.Config{Lease: stepKillLease, Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestStepKillChild is the process TestStepsResumeAfterKill runs: with
// role "do" it runs the operation with idem.Do; with role "http" it serves
// it behind idemhttp on a loopback port it prints ("LISTENING addr").
func TestStepKillChild(t *testing.T) {
	role := os.Getenv(envStepKillRole)
	if role == "" {
		t.Skip("run by TestStepsResumeAfterKill")
	}
	e := stepKillEngine(t, os.Getenv(envStepKillStore), "child-"+strconv.Itoa(os.Getpid()))
	file, block := os.Getenv(envStepKillEffects), os.Getenv(envStepKillBlock) == "1"
	if role == "do" {
		req := idem.Request{Operation: stepKillOperation, Key: os.Getenv(envStepKillKey), Payload: []byte(stepKillPayload)}
		_, err := idem.Do(context.Background(), e, req, func(ctx context.Context) (orderReceipt, error) {
			return placeOrder(ctx, file, block)
		})
		t.Fatalf("the operation returned (%v); it blocks until killed", err)
	}
	m, err := idemhttp.New(e, &idemhttp.Config{Operation: stepKillOperation})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("LISTENING " + l.Addr().String())
	err = http.Serve(l, m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc, err := placeOrder(r.Context(), file, block)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rc)
	})))
	t.Fatal(err)
}

// stepKillStores are the networked stores the scenario runs on: each
// subtest's URL names a store of its own (a Redis key prefix, a
// PostgreSQL table dropped at cleanup).
var stepKillStores = []struct {
	name string
	url  func(t *testing.T) string
}{
	{"redis", func(t *testing.T) string {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		prefix := fmt.Sprintf("stepkill-%x:", rand.Uint64())
		t.Cleanup(func() { deleteKeys(t, addr, prefix) })
		return fmt.Sprintf("redis://%s/0?prefix=%s", addr, prefix)
	}},
	{"postgres", func(t *testing.T) string {
		addr := testenv.Reach(t, "PostgreSQL", "IDEM_PG_ADDR", "127.0.0.1:5432")
		conn := fmt.Sprintf("postgres://%s@%s/test", PGUser(), addr)
		table := fmt.Sprintf("stepkill_%x", rand.Uint64())
		raw := conn + "?table=" + table
		if _, err := storeurl.Migrate(context.Background(), raw); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dropTable(t, conn, table) })
		return raw
	}},
}

// deleteKeys deletes the Redis keys under prefix.
func deleteKeys(t *testing.T, addr, prefix string) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	it := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for it.Next(ctx) {
		if err := c.Del(ctx, it.Val()).Err(); err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
	}
	if err := it.Err(); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// TestStepsResumeAfterKill is the promise of docs/steps.md on the real
// thing, over Redis and PostgreSQL: a process running a three-step
// operation is SIGKILLed between its second and third step; after its
// lease another process (this one through idem.Do; a second child through
// idemhttp) resumes: charge and email ran once, in the killed process,
// ledger once, in the resuming one, and a third call replays the result.
func TestStepsResumeAfterKill(t *testing.T) {
	t.Parallel()
	for _, st := range stepKillStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			t.Run("Do", func(t *testing.T) {
				t.Parallel()
				stepKillDo(t, st.url(t))
			})
			t.Run("idemhttp", func(t *testing.T) {
				t.Parallel()
				stepKillHTTP(t, st.url(t))
			})
		})
	}
}

func stepKillEnv(raw, file string, block bool, more ...string) []string {
	env := []string{envStepKillStore + "=" + raw, envStepKillEffects + "=" + file}
	if block {
		env = append(env, envStepKillBlock+"=1")
	}
	return append(env, more...)
}

// kill SIGKILLs the child and waits for it.
func kill(t *testing.T, c *childproc.Child) {
	t.Helper()
	if err := c.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.Cmd.Wait()
}

// checkEffects fails t unless charge and email ran once, in the process
// killed, and ledger once, in the process resumer.
func checkEffects(t *testing.T, file string, killed, resumer int) {
	t.Helper()
	got := effects(t, file)
	want := map[string][]string{
		"charge": {"charge " + strconv.Itoa(killed)},
		"email":  {"email " + strconv.Itoa(killed)},
		"ledger": {"ledger " + strconv.Itoa(resumer)},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
}

func stepKillDo(t *testing.T, raw string) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "effects")
	key := fmt.Sprintf("order-%x", rand.Uint64())
	req := idem.Request{Operation: stepKillOperation, Key: key, Payload: []byte(stepKillPayload)}
	e := stepKillEngine(t, raw, "survivor")

	c := childproc.Start(t, "TestStepKillChild", stepKillEnv(raw, file, true, envStepKillRole+"=do", envStepKillKey+"="+key)...)
	c.WaitLine(t, stepsRecorded)
	id, err := req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.Status(ctx, id.StoreKey)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, st := range s.Steps {
		names = append(names, st.Name)
	}
	if s.Status != idem.StatusInProgress || !slices.Equal(names, []string{"charge", "email"}) {
		t.Fatalf("before the kill: %s with steps %v, want IN_PROGRESS with charge and email", s.Status, names)
	}
	killed := c.Cmd.Process.Pid
	kill(t, c)

	// The dead holder's lease is honoured, then the key is taken over.
	ran := 0
	op := func(ctx context.Context) (orderReceipt, error) {
		ran++
		return placeOrder(ctx, file, false)
	}
	res, err := idem.Do(ctx, e, req, op)
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) || ran != 0 {
		t.Fatalf("at once after the kill: %+v, %v (ran %d), want in progress", res, err, ran)
	}
	deadline := time.Now().Add(10 * stepKillLease)
	for errors.As(err, &ipe) && time.Now().Before(deadline) {
		time.Sleep(time.Until(ipe.LeaseUntil) + 10*time.Millisecond) // another process's lease must pass
		res, err = idem.Do(ctx, e, req, op)
	}
	if err != nil || res.Replayed || ran != 1 {
		t.Fatalf("after the lease: %+v, %v (ran %d), want a run", res, err, ran)
	}
	want := orderReceipt{
		ChargeID:  "charge " + strconv.Itoa(killed),
		MessageID: "email " + strconv.Itoa(killed),
		Entry:     "ledger " + strconv.Itoa(os.Getpid()),
	}
	if res.Value != want {
		t.Fatalf("resumed result %+v, want %+v", res.Value, want)
	}
	checkEffects(t, file, killed, os.Getpid())

	res, err = idem.Do(ctx, e, req, op)
	if err != nil || !res.Replayed || res.Value != want || ran != 1 {
		t.Fatalf("third call: %+v, %v (ran %d), want a replay of %+v", res, err, ran, want)
	}
	checkEffects(t, file, killed, os.Getpid())
}

// startServer starts a child serving the operation behind idemhttp and
// returns it with its base URL.
func startServer(t *testing.T, env []string) (*childproc.Child, string) {
	c := childproc.Start(t, "TestStepKillChild", append(env, envStepKillRole+"=http")...)
	var addr string
	c.Scan(t, func(line string) bool {
		addr, _ = strings.CutPrefix(line, "LISTENING ")
		return addr != line
	})
	return c, "http://" + addr + "/orders"
}

func stepKillHTTP(t *testing.T, raw string) {
	file := filepath.Join(t.TempDir(), "effects")
	key := fmt.Sprintf("order-%x", rand.Uint64())
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	send := func(url string) (*http.Response, []byte, error) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(stepKillPayload))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderName, `"`+key+`"`)
		resp, err := client.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}

	first, url := startServer(t, stepKillEnv(raw, file, true))
	var wg sync.WaitGroup
	var firstErr error
	wg.Go(func() { _, _, firstErr = send(url) })
	first.WaitLine(t, stepsRecorded)
	killed := first.Cmd.Process.Pid
	kill(t, first)
	wg.Wait()
	if firstErr == nil {
		t.Fatal("the request to the killed server got an answer")
	}

	second, url := startServer(t, stepKillEnv(raw, file, false))
	// While the dead holder's lease lasts the key is in progress (409);
	// the second child may have started after it passed.
	resp, body, err := send(url)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * stepKillLease)
	for resp.StatusCode == http.StatusConflict && time.Now().Before(deadline) {
		time.Sleep(stepKillLease / 10) // another process's lease must pass
		if resp, body, err = send(url); err != nil {
			t.Fatal(err)
		}
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("after the lease: %d %v %s, want 200, not replayed", resp.StatusCode, resp.Header, body)
	}
	var got orderReceipt
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	want := orderReceipt{
		ChargeID:  "charge " + strconv.Itoa(killed),
		MessageID: "email " + strconv.Itoa(killed),
		Entry:     "ledger " + strconv.Itoa(second.Cmd.Process.Pid),
	}
	if got != want {
		t.Fatalf("resumed response %+v, want %+v", got, want)
	}
	checkEffects(t, file, killed, second.Cmd.Process.Pid)

	resp, replay, err := send(url)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get(idemhttp.ReplayedHeader) != "true" || !bytes.Equal(replay, body) {
		t.Fatalf("third send: %v %s %v, want a replay of %s", resp, replay, err, body)
	}
	checkEffects(t, file, killed, second.Cmd.Process.Pid)
}
