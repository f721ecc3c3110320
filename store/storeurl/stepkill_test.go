package storeurl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemtest/childproc"
	"github.com/seed-a1b882c0/idem/idemtest/consoletest"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
	"github.com/seed-a1b882c0/idem/ops"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// The step kill scenario: a process runs a three-step operation (charge,
// email, ledger) over a networked store and is SIGKILLed, after its second
// step was recorded or inside it; another process resumes the operation
// once the dead holder's lease has passed: the recorded steps are not run
// again, the others run once, and a later call replays the result. Under
// the takeover policy Hold the key is not resumed but waits for an
// operator, who settles it through the console.

// target is the store of one subtest, and the lease of every engine of
// the scenario over it: a dead holder's claim is taken over this long
// after its last renewal.
type target struct {
	raw   string // the store URL
	lease time.Duration
}

// The environment of a child of the scenario.
const (
	envStepKillRole    = "IDEM_STEPKILL_ROLE"    // "do": idem.Do, "http": an idemhttp server
	envStepKillStore   = "IDEM_STEPKILL_STORE"   // the store URL
	envStepKillLease   = "IDEM_STEPKILL_LEASE"   // the lease (a duration)
	envStepKillEffects = "IDEM_STEPKILL_EFFECTS" // the file the steps' effects are appended to
	envStepKillKey     = "IDEM_STEPKILL_KEY"     // the key (role "do")
	envStepKillBlock   = "IDEM_STEPKILL_BLOCK"   // where to block, to be killed: a killPoint's block
	envStepKillHold    = "IDEM_STEPKILL_HOLD"    // "1": claim under the takeover policy Hold
)

const (
	stepKillOperation = "place-order"
	stepKillPayload   = `{"cents":500}`
)

// killPoint is where the child blocks, to be killed.
type killPoint struct {
	name  string // the subtest's
	block string // envStepKillBlock's value
	line  string // the child's line once it blocks there
	// recorded are the steps recorded when it blocks; started is the step
	// whose effect happened but which did not return ("" for none).
	recorded []string
	started  string
}

var (
	// betweenSteps: after Step "email" returned, both steps recorded.
	betweenSteps = killPoint{name: "between steps", block: "after-email", line: "STEPS RECORDED", recorded: []string{"charge", "email"}}
	// insideStep: inside Step "email", once its effect happened, before
	// it returned: only charge is recorded.
	insideStep = killPoint{name: "inside a step", block: "in-email", line: "EMAIL SENT", recorded: []string{"charge"}, started: "email"}
)

// orderSteps are the operation's steps, in order.
var orderSteps = []string{"charge", "email", "ledger"}

// ranIn is the effects file's lines of a step that ran in the processes
// pids, in that order.
func ranIn(name string, pids ...int) []string {
	var out []string
	for _, pid := range pids {
		out = append(out, name+" "+strconv.Itoa(pid))
	}
	return out
}

// resumed is what a resume by the process resumer of an operation killed
// at kp in the process killed returns, and the effects file then: a
// recorded step's value is the killed process's and ran there only; every
// other step ran in the resumer (the one started, in both).
func (kp killPoint) resumed(killed, resumer int) (orderReceipt, map[string][]string) {
	effects := map[string][]string{}
	value := map[string]string{}
	for _, name := range orderSteps {
		by := []int{resumer}
		switch {
		case slices.Contains(kp.recorded, name):
			by = []int{killed}
		case name == kp.started:
			by = []int{killed, resumer}
		}
		effects[name] = ranIn(name, by...)
		value[name] = effects[name][len(by)-1]
	}
	return orderReceipt{ChargeID: value["charge"], MessageID: value["email"], Entry: value["ledger"]}, effects
}

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

// placeOrder is the operation: three steps, each an effect on the file.
// With block a killPoint's block, it says that point's line there and
// never returns.
func placeOrder(ctx context.Context, file, block string) (orderReceipt, error) {
	var r orderReceipt
	var err error
	blockAt := func(kp killPoint) {
		if block == kp.block {
			fmt.Println(kp.line)
			select {} // killed here
		}
	}
	step := func(name string) (string, error) {
		return idem.Step(ctx, name, func(context.Context) (string, error) {
			v, err := effect(file, name)
			if err == nil && name == insideStep.started {
				blockAt(insideStep)
			}
			return v, err
		})
	}
	if r.ChargeID, err = step("charge"); err != nil {
		return r, err
	}
	if r.MessageID, err = step("email"); err != nil {
		return r, err
	}
	blockAt(betweenSteps)
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

// stepKillEngine opens tg's store (closed at cleanup) and returns it and
// an engine over it.
func stepKillEngine(t testing.TB, tg target, owner string) (store.Store, *idem.Engine) {
	t.Helper()
	s, err := storeurl.Open(context.Background(), tg.raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e, err := idem.New(s.Store, &idem.Config{Lease: tg.lease, Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	return s.Store, e
}

// TestStepKillChild is the process TestStepsResumeAfterKill runs: with
// role "do" it runs the operation with idem.Do; with role "http" it serves
// it behind idemhttp on a loopback port it prints ("LISTENING addr").
func TestStepKillChild(t *testing.T) {
	role := os.Getenv(envStepKillRole)
	if role == "" {
		t.Skip("run by TestStepsResumeAfterKill")
	}
	lease, err := time.ParseDuration(os.Getenv(envStepKillLease))
	if err != nil {
		t.Fatal(err)
	}
	_, e := stepKillEngine(t, target{os.Getenv(envStepKillStore), lease}, "child-"+strconv.Itoa(os.Getpid()))
	file, block, hold := os.Getenv(envStepKillEffects), os.Getenv(envStepKillBlock), os.Getenv(envStepKillHold) == "1"
	if role == "do" {
		req := stepKillRequest(os.Getenv(envStepKillKey), hold)
		_, err := idem.Do(context.Background(), e, req, func(ctx context.Context) (orderReceipt, error) {
			return placeOrder(ctx, file, block)
		})
		t.Fatalf("the operation returned (%v); it blocks until killed", err)
	}
	m, err := idemhttp.New(e, &idemhttp.Config{Operation: stepKillOperation, HoldCrashed: hold})
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
// PostgreSQL table or a DynamoDB table, dropped at cleanup). Redis and
// PostgreSQL tell their time to the millisecond, DynamoDB in whole
// seconds (its Date header): each process's measure of its clock is
// within half a second, so two may disagree by a second on when a lease
// passes, and its lease is longer, so that a call at once after the kill
// is still within the dead holder's lease.
var stepKillStores = []stepKillStore{
	{"redis", time.Second, func(t *testing.T) string {
		addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
		prefix := fmt.Sprintf("stepkill-%x:", rand.Uint64())
		t.Cleanup(func() { deleteKeys(t, addr, prefix) })
		return fmt.Sprintf("redis://%s/0?prefix=%s", addr, prefix)
	}},
	{"postgres", time.Second, func(t *testing.T) string {
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
	{"dynamodb", 3 * time.Second, func(t *testing.T) string {
		ep := testenv.DynamoDB(t)
		localCredentials()
		table := fmt.Sprintf("stepkill_%x", rand.Uint64())
		raw := fmt.Sprintf("dynamodb://%s?region=us-east-1&endpoint=%s", table, ep)
		if err := storeurl.CreateTable(context.Background(), raw, time.Minute); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteDynamoTable(t, ep, table) })
		return raw
	}},
}

type stepKillStore struct {
	name  string
	lease time.Duration
	url   func(t *testing.T) string
}

// target returns a store of t's own.
func (s stepKillStore) target(t *testing.T) target { return target{s.url(t), s.lease} }

// localCredentials gives this process, and the children it starts, the
// AWS credentials DynamoDB Local is reached with (any will do), unless
// the environment has some: the scenario's subtests run in parallel,
// where t.Setenv is not allowed.
var localCredentials = sync.OnceFunc(func() {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, "local")
		}
	}
})

// deleteDynamoTable deletes the DynamoDB Local table at ep.
func deleteDynamoTable(t *testing.T, ep, table string) {
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep), HTTPClient: &http.Client{Transport: tr},
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		}),
	})
	if _, err := c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
		t.Errorf("cleanup: %v", err)
	}
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
// thing, over Redis, PostgreSQL and DynamoDB: a process running a
// three-step operation is SIGKILLed between its second and third step, or
// inside its second once its effect happened; after its lease another
// process (this one through idem.Do; a second child through idemhttp)
// resumes: the recorded steps ran once, in the killed process, and their
// recorded values make the result; the step it was killed inside ran
// again, and the rest once, in the resuming process; a third call replays
// the result.
func TestStepsResumeAfterKill(t *testing.T) {
	t.Parallel()
	for _, st := range stepKillStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			for _, kp := range []killPoint{betweenSteps, insideStep} {
				t.Run(kp.name, func(t *testing.T) {
					t.Parallel()
					t.Run("Do", func(t *testing.T) {
						t.Parallel()
						stepKillDo(t, st.target(t), kp)
					})
					t.Run("idemhttp", func(t *testing.T) {
						t.Parallel()
						stepKillHTTP(t, st.target(t), kp)
					})
				})
			}
		})
	}
}

// TestHeldStepsSettledByAnOperator: the same kill between steps, of an
// operation claimed under the takeover policy Hold (Request.HoldCrashed),
// over Redis, PostgreSQL and DynamoDB. After the lease a call gets
// idem.ErrHeld and runs nothing; the listing of stuck records (ops.List,
// what idemctl list --stuck and the console read) shows the key held; an
// operator settles it through the console's guarded write. Released, the
// next call runs the operation from the start (the recorded steps went
// with the record); resolved with a result, the next call replays it and
// runs nothing.
func TestHeldStepsSettledByAnOperator(t *testing.T) {
	t.Parallel()
	for _, st := range stepKillStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			for _, action := range []string{"release", "resolve"} {
				t.Run(action, func(t *testing.T) {
					t.Parallel()
					stepKillHeld(t, st.target(t), action)
				})
			}
		})
	}
}

func stepKillEnv(tg target, file string, kp killPoint, hold bool, more ...string) []string {
	env := []string{envStepKillStore + "=" + tg.raw, envStepKillLease + "=" + tg.lease.String(), envStepKillEffects + "=" + file, envStepKillBlock + "=" + kp.block}
	if hold {
		env = append(env, envStepKillHold+"=1")
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

// checkEffects fails t unless the effects file holds want.
func checkEffects(t *testing.T, file string, want map[string][]string) {
	t.Helper()
	if got := effects(t, file); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
}

func stepKillRequest(key string, hold bool) idem.Request {
	return idem.Request{Operation: stepKillOperation, Key: key, Payload: []byte(stepKillPayload), HoldCrashed: hold}
}

// doCase is one run of the scenario through idem.Do: a child runs the
// operation and is killed; this process, the survivor, calls again.
type doCase struct {
	tg    target
	file  string
	req   idem.Request
	store store.Store
	e     *idem.Engine
	ran   int // how many times the survivor ran the operation
}

func newDoCase(t *testing.T, tg target, hold bool) *doCase {
	s, e := stepKillEngine(t, tg, "survivor")
	return &doCase{tg: tg, file: filepath.Join(t.TempDir(), "effects"),
		req: stepKillRequest(fmt.Sprintf("order-%x", rand.Uint64()), hold), store: s, e: e}
}

// do calls the operation through idem.Do in this process.
func (c *doCase) do(ctx context.Context) (idem.Result[orderReceipt], error) {
	return idem.Do(ctx, c.e, c.req, func(ctx context.Context) (orderReceipt, error) {
		c.ran++
		return placeOrder(ctx, c.file, "")
	})
}

func (c *doCase) storeKey(t *testing.T) idem.StoreKey {
	id, err := c.req.Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.StoreKey
}

// killChild runs the operation in a child until kp, checks that the key
// is IN_PROGRESS with kp's steps recorded, SIGKILLs the child and returns
// its process id.
func (c *doCase) killChild(t *testing.T, kp killPoint) int {
	child := childproc.Start(t, "TestStepKillChild", stepKillEnv(c.tg, c.file, kp, c.req.HoldCrashed, envStepKillRole+"=do", envStepKillKey+"="+c.req.Key)...)
	child.WaitLine(t, kp.line)
	s, err := c.e.Status(context.Background(), c.storeKey(t))
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, st := range s.Steps {
		names = append(names, st.Name)
	}
	if s.Status != idem.StatusInProgress || !slices.Equal(names, kp.recorded) {
		t.Fatalf("before the kill: %s with steps %v, want IN_PROGRESS with %v", s.Status, names, kp.recorded)
	}
	killed := child.Cmd.Process.Pid
	kill(t, child)
	return killed
}

// afterLease calls at once after the kill, which is refused as in
// progress (the dead holder's lease is honoured) and runs nothing, then
// again once the lease has passed, and returns that call's answer.
func (c *doCase) afterLease(t *testing.T) (idem.Result[orderReceipt], error) {
	ctx := context.Background()
	res, err := c.do(ctx)
	var ipe *idem.InProgressError
	if !errors.As(err, &ipe) || c.ran != 0 {
		t.Fatalf("at once after the kill: %+v, %v (ran %d), want in progress", res, err, c.ran)
	}
	deadline := time.Now().Add(10 * c.tg.lease)
	for errors.As(err, &ipe) && time.Now().Before(deadline) {
		time.Sleep(time.Until(ipe.LeaseUntil) + 10*time.Millisecond) // another process's lease must pass
		res, err = c.do(ctx)
	}
	return res, err
}

func stepKillDo(t *testing.T, tg target, kp killPoint) {
	c := newDoCase(t, tg, false)
	killed := c.killChild(t, kp)
	res, err := c.afterLease(t)
	if err != nil || res.Replayed || c.ran != 1 {
		t.Fatalf("after the lease: %+v, %v (ran %d), want a run", res, err, c.ran)
	}
	want, effects := kp.resumed(killed, os.Getpid())
	if res.Value != want {
		t.Fatalf("resumed result %+v, want %+v", res.Value, want)
	}
	checkEffects(t, c.file, effects)

	res, err = c.do(context.Background())
	if err != nil || !res.Replayed || res.Value != want || c.ran != 1 {
		t.Fatalf("third call: %+v, %v (ran %d), want a replay of %+v", res, err, c.ran, want)
	}
	checkEffects(t, c.file, effects)
}

// eventually calls done until it reports true, for at most 10 leases.
func eventually(t *testing.T, lease time.Duration, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * lease)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("not done after %v", 10*lease)
		}
		time.Sleep(lease / 20) // another process's lease must pass, on the reader's clock
	}
}

// consoleSecret signs the operator in to the console of stepKillHeld.
const consoleSecret = "stepkill-operator-secret"

// operatorConsole serves a writable console over s on a loopback port
// and returns a client signed in to it.
func operatorConsole(t *testing.T, s store.Store) *consoletest.Client {
	con, err := console.New(s, &console.Config{Write: true, Credentials: []console.Credential{{User: "ops", Secret: consoleSecret}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(func() {
		srv.Close()
		con.Close()
	})
	c := consoletest.NewClient(t, srv.URL+"/")
	t.Cleanup(c.HTTP.CloseIdleConnections)
	c.SignIn("ops", consoleSecret)
	return c
}

func stepKillHeld(t *testing.T, tg target, action string) {
	ctx := context.Background()
	c := newDoCase(t, tg, true)
	killed := c.killChild(t, betweenSteps)
	killedRan := map[string][]string{"charge": ranIn("charge", killed), "email": ranIn("email", killed)}
	res, err := c.afterLease(t)
	if !errors.Is(err, idem.ErrHeld) || c.ran != 0 {
		t.Fatalf("after the lease: %+v, %v (ran %d), want held", res, err, c.ran)
	}
	checkEffects(t, c.file, killedRan)

	// Listed as idemctl list --stuck lists it: stuck, and held; then an
	// operator opens it in the console and sees it held. Both judge the
	// record on the store's clock as they measured it, as the engine
	// does; DynamoDB tells it in whole seconds (each measurement is within
	// half a second), so they may see the lease pass up to a second after
	// the engine did.
	key := c.storeKey(t)
	op := &ops.Operator{Store: c.store}
	var page ops.Page
	eventually(t, c.tg.lease, func() bool {
		if err := op.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if page, err = ops.List(ctx, c.store.(store.Lister), ops.Query{Stuck: true}, op.Now()); err != nil {
			t.Fatal(err)
		}
		return len(page.Records) > 0
	})
	if len(page.Records) != 1 || page.Records[0].Key != key.String() || !page.Records[0].Hold {
		t.Fatalf("stuck records %+v, want %s, held", page.Records, key)
	}
	operator := operatorConsole(t, c.store)
	var body string
	eventually(t, c.tg.lease, func() bool {
		_, body, _ = operator.Get("record?" + url.Values{"key": {key.String()}}.Encode())
		return strings.Contains(body, `data-field="stuck"`)
	})
	if !strings.Contains(body, `data-field="held"`) {
		t.Fatalf("the record page does not say held:\n%s", body)
	}
	switch action {
	case "release":
		// Releasing deletes the record and its steps: the next call runs
		// the operation from the start.
		if code, loc := operator.Act(key, "release", nil); code != http.StatusSeeOther {
			t.Fatalf("release: %d %s", code, loc)
		}
		res, err = c.do(ctx)
		me := os.Getpid()
		want := orderReceipt{ChargeID: ranIn("charge", me)[0], MessageID: ranIn("email", me)[0], Entry: ranIn("ledger", me)[0]}
		if err != nil || res.Replayed || c.ran != 1 || res.Value != want {
			t.Fatalf("after the release: %+v, %v (ran %d), want a run from the start, %+v", res, err, c.ran, want)
		}
		checkEffects(t, c.file, map[string][]string{
			"charge": ranIn("charge", killed, me), "email": ranIn("email", killed, me), "ledger": ranIn("ledger", me),
		})
	case "resolve":
		// Resolving settles the key with the operator's result: the steps
		// left never run, the next call replays it.
		want := orderReceipt{ChargeID: killedRan["charge"][0], MessageID: killedRan["email"][0], Entry: "posted by hand"}
		result, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if code, loc := operator.Act(key, "complete", url.Values{"result": {string(result)}}); code != http.StatusSeeOther {
			t.Fatalf("resolve: %d %s", code, loc)
		}
		res, err = c.do(ctx)
		if err != nil || !res.Replayed || c.ran != 0 || res.Value != want {
			t.Fatalf("after the resolve: %+v, %v (ran %d), want a replay of %+v", res, err, c.ran, want)
		}
		checkEffects(t, c.file, killedRan)
	}
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

func stepKillHTTP(t *testing.T, tg target, kp killPoint) {
	file := filepath.Join(t.TempDir(), "effects")
	key := fmt.Sprintf("order-%x", rand.Uint64())
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	send := func(orders string) (*http.Response, []byte, error) {
		req, err := http.NewRequest(http.MethodPost, orders, strings.NewReader(stepKillPayload))
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

	first, orders := startServer(t, stepKillEnv(tg, file, kp, false))
	var wg sync.WaitGroup
	var firstErr error
	wg.Go(func() { _, _, firstErr = send(orders) })
	first.WaitLine(t, kp.line)
	killed := first.Cmd.Process.Pid
	kill(t, first)
	wg.Wait()
	if firstErr == nil {
		t.Fatal("the request to the killed server got an answer")
	}

	second, orders := startServer(t, stepKillEnv(tg, file, killPoint{}, false))
	// While the dead holder's lease lasts the key is in progress (409);
	// the second child may have started after it passed.
	resp, body, err := send(orders)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * tg.lease)
	for resp.StatusCode == http.StatusConflict && time.Now().Before(deadline) {
		time.Sleep(tg.lease / 10) // another process's lease must pass
		if resp, body, err = send(orders); err != nil {
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
	want, effects := kp.resumed(killed, second.Cmd.Process.Pid)
	if got != want {
		t.Fatalf("resumed response %+v, want %+v", got, want)
	}
	checkEffects(t, file, effects)

	resp, replay, err := send(orders)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get(idemhttp.ReplayedHeader) != "true" || !bytes.Equal(replay, body) {
		t.Fatalf("third send: %v %s %v, want a replay of %s", resp, replay, err, body)
	}
	checkEffects(t, file, effects)
}
