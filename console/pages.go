package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/ops"
	"github.com/seed-a1b882c0/idem/store"
)

// parsePages parses every page with the layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{"ts": ts, "age": age, "window": ops.Window, "dur": dur,
		// field names a shown body for the pages' data-field markers.
		"field": func(name string, b *body) struct {
			Name string
			B    *body
		} {
			return struct {
				Name string
				B    *body
			}{name, b}
		},
		"pair": func(p page, r recordView) struct {
			P page
			R recordView
		} {
			return struct {
				P page
				R recordView
			}{p, r}
		}}
	out := make(map[string]*template.Template)
	for _, p := range []string{"overview", "records", "record", "confirm", "login", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return nil, err
		}
		out[p] = t
	}
	return out, nil
}

// page is what every page gets.
type page struct {
	Base, Title, Name string
	User, CSRF        string
	Write, Auth       bool
	Now               time.Time
	Data              any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, code int, name, title string, data any) {
	p := page{Base: c.cfg.BasePath, Title: title, Name: c.cfg.Name, Write: c.cfg.Write, Auth: len(c.cfg.Credentials) > 0, Now: c.now(), Data: data}
	if s != nil {
		p.User, p.CSRF = s.user, s.csrf
	}
	var buf bytes.Buffer
	if err := c.pages[name].Execute(&buf, p); err != nil {
		c.cfg.Logger.Error("idem console: rendering a page", "page", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// age is d rounded for people.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < 24*time.Hour:
		return d.Round(time.Minute).String()
	}
	days, hours := d/(24*time.Hour), (d%(24*time.Hour)+30*time.Minute)/time.Hour
	if hours == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%dh", days, hours)
}

// dur is d as a duration the forms read back: 24h, 90m, 1h30m.
func dur(d time.Duration) string {
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// overview

type opRow struct {
	Operation                 string
	InProgress, Stuck, Failed int
	Oldest                    time.Duration
	StuckURL, FailedURL, URL  string
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	data := map[string]any{"CanList": c.lister != nil}
	if c.mon != nil {
		snap := c.mon.Last()
		if snap.At.IsZero() { // no sweep finished yet: this page waits for one
			ctx, cancel := storeCtx(r)
			snap, _ = c.mon.Sweep(ctx)
			cancel()
		}
		data["Snap"] = snap
		data["Swept"] = !snap.At.IsZero()
		data["Bound"] = ""
		if snap.Truncated { // every count is a lower bound, and says so next to the number
			data["Bound"] = "≥ "
		}
		var rows []opRow
		for op, n := range snap.ByOperation() {
			rows = append(rows, opRow{Operation: op, InProgress: n.InProgress, Stuck: n.Stuck, Failed: n.Failed, Oldest: n.OldestInProgress,
				URL:       c.listURL(url.Values{"scope": {op}}),
				StuckURL:  c.listURL(url.Values{"stuck": {"1"}, "scope": {op}}),
				FailedURL: c.listURL(url.Values{"status": {"failed"}, "scope": {op}})})
		}
		slices.SortFunc(rows, func(a, b opRow) int { return strings.Compare(a.Operation, b.Operation) })
		data["Ops"] = rows
		if snap.Err != nil {
			data["SweepErr"] = snap.Err.Error()
		}
	}
	data["StuckURL"] = c.listURL(url.Values{"stuck": {"1"}})
	data["FailedURL"] = c.listURL(url.Values{"status": {"failed"}})
	data["InProgressURL"] = c.listURL(url.Values{"status": {"in_progress"}})
	c.render(w, r, s, http.StatusOK, "overview", "Overview", data)
}

func (c *Console) listURL(q url.Values) string { return c.cfg.BasePath + "records?" + q.Encode() }

func (c *Console) recordURL(key string, extra ...string) string {
	q := url.Values{"key": {key}}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	return c.cfg.BasePath + "record?" + q.Encode()
}

// records

// listQuery is the records page's filters, as the form shows them, and
// the listing they ask package ops for.
type listQuery struct {
	Status           string // "", in_progress, completed, failed
	Stuck            bool
	Scope, OlderThan string
	Limit            int
	Cursor           string

	q ops.Query
}

// parseList reads the filters, naming the parameter that is wrong.
func (c *Console) parseList(q url.Values) (listQuery, error) {
	l := listQuery{Status: q.Get("status"), Scope: strings.TrimSpace(q.Get("scope")), OlderThan: strings.TrimSpace(q.Get("older")),
		Cursor: q.Get("cursor"), Limit: c.cfg.PageSize}
	switch v := q.Get("stuck"); v {
	case "", "0", "false":
	case "1", "on", "true":
		l.Stuck = true
	default:
		return l, fmt.Errorf("stuck=%q: want 1 or nothing", v)
	}
	if l.Status != "" {
		st, err := store.ParseStatus(strings.ToUpper(l.Status))
		if err != nil {
			return l, fmt.Errorf("status=%q: want in_progress, completed or failed", l.Status)
		}
		l.q.Status = st
	}
	if l.Stuck && l.q.Status.Valid() && l.q.Status != store.StatusInProgress {
		return l, fmt.Errorf("stuck=1 with status=%s: only IN_PROGRESS records are stuck", l.Status)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return l, fmt.Errorf("limit=%q: want a number from 1 to 500", v)
		}
		l.Limit = n
	}
	if l.OlderThan != "" {
		d, err := time.ParseDuration(l.OlderThan)
		if err != nil || d < 0 {
			return l, fmt.Errorf("older=%q: want a duration such as 90s, 15m or 2h", l.OlderThan)
		}
		l.q.OlderThan = d
	}
	if ops.CheckScope(l.Scope) != nil {
		return l, fmt.Errorf("scope=%q: want an operation name, or NAME/TENANT", l.Scope)
	}
	l.q.Stuck, l.q.Scope, l.q.Limit, l.q.Cursor, l.q.MaxScan = l.Stuck, l.Scope, l.Limit, l.Cursor, c.cfg.MaxScan
	return l, l.q.Validate()
}

// row is one record in the list.
type row struct {
	Key, Status, Owner, Ref, URL string
	Stuck, Held                  bool
	Created, Expected            time.Time
	Age                          time.Duration
}

func (c *Console) records(w http.ResponseWriter, r *http.Request, s *session) {
	if c.lister == nil {
		c.fail(w, r, s, http.StatusNotImplemented, fmt.Sprintf("This store (%T) cannot list records; open a record by its key.", c.store))
		return
	}
	l, err := c.parseList(r.URL.Query())
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, "Bad filter: "+err.Error())
		return
	}
	ctx, cancel := storeCtx(r)
	defer cancel()
	if err := c.op.Sync(ctx); err != nil {
		c.storeFailure(w, r, s, err)
		return
	}
	now := c.op.Now() // the store's: stuck as the engine decides leases
	start := time.Now()
	page, err := ops.List(ctx, c.lister, l.q, now)
	if err != nil {
		c.storeFailure(w, r, s, err)
		return
	}
	rows := make([]row, 0, len(page.Records))
	for _, rec := range page.Records {
		rows = append(rows, c.rowOf(rec, now))
	}
	data := map[string]any{"Q": l, "Rows": rows, "Scanned": page.Scanned, "Took": time.Since(start).Round(time.Millisecond),
		"Filtered": l.q.Filtered(), "Limit": l.Limit}
	if page.Next != "" {
		q := r.URL.Query()
		q.Set("cursor", page.Next)
		data["NextURL"] = c.listURL(q)
	}
	if l.Cursor != "" {
		q := r.URL.Query()
		q.Del("cursor")
		data["FirstURL"] = c.listURL(q)
	}
	c.render(w, r, s, http.StatusOK, "records", "Records", data)
}

func (c *Console) rowOf(rec *store.Record, now time.Time) row {
	created := store.FromMillis(rec.CreatedAt)
	return row{Key: rec.Key, Status: rec.Status.String(), Owner: rec.Owner, Ref: rec.Ref, URL: c.recordURL(rec.Key),
		Stuck:   rec.Status == store.StatusInProgress && rec.LeaseExpired(store.Millis(now)),
		Held:    rec.Held(store.Millis(now)),
		Created: created, Expected: store.FromMillis(rec.LeaseUntil), Age: now.Sub(created)}
}

// record

// body is a result or error body as shown.
type body struct {
	Kind      string // "JSON", "text", "binary (hex)"
	Text      string
	Size      int
	Truncated bool
}

// showBody formats b: JSON indented, UTF-8 text as is, anything else as a
// hex dump; at most max bytes of it.
func showBody(b []byte, max int) *body {
	if len(b) == 0 {
		return nil
	}
	out := &body{Size: len(b)}
	if len(b) <= max && json.Valid(b) {
		var buf bytes.Buffer
		if json.Indent(&buf, b, "", "  ") == nil && buf.Len() <= 2*max {
			out.Kind, out.Text = "JSON", buf.String()
			return out
		}
	}
	shown := b
	if len(shown) > max {
		shown, out.Truncated = shown[:max], true
	}
	if utf8.Valid(shown) || (out.Truncated && utf8.Valid(shown[:max-min(max, 3)])) {
		out.Kind, out.Text = "text", strings.ToValidUTF8(string(shown), "\uFFFD")
		return out
	}
	out.Kind, out.Text = "binary (hex)", hex.Dump(shown)
	return out
}

// showResult formats a record's result as showBody does, except a
// response idemhttp or idem-gateway stored (idemhttp.ParseStored): its
// status line and header, then its body as showBody shows it (a JSON body
// indented, as JSON), instead of the record's JSON with the body in base64.
func showResult(b []byte, max int) *body {
	resp, ok := idemhttp.ParseStored(b)
	if !ok {
		return showBody(b, max)
	}
	var text strings.Builder
	fmt.Fprintf(&text, "HTTP %d %s\n", resp.Status, http.StatusText(resp.Status))
	for _, name := range slices.Sorted(maps.Keys(resp.Header)) {
		for _, v := range resp.Header[name] {
			fmt.Fprintf(&text, "%s: %s\n", name, v)
		}
	}
	out := &body{Kind: fmt.Sprintf("HTTP %d response, no body", resp.Status), Size: len(resp.Body)}
	if inner := showBody(resp.Body, max); inner != nil {
		text.WriteString("\n")
		text.WriteString(inner.Text)
		out.Kind, out.Truncated = fmt.Sprintf("HTTP %d response, body %s", resp.Status, inner.Kind), inner.Truncated
	}
	out.Text = strings.ToValidUTF8(text.String(), "\uFFFD")
	return out
}

// stepFunctionsARN is a Step Functions execution ARN in the aws partition.
var stepFunctionsARN = regexp.MustCompile(`^arn:aws:states:([a-z]{2}(?:-[a-z]+)+-\d):\d{12}:execution:[A-Za-z0-9_.\-]+:[A-Za-z0-9_.\-]+$`)

// refURL links an execution reference: a Step Functions ARN to the AWS
// console, anything else through the RefLink template; "" for no link.
func (c *Console) refURL(ref string) string {
	if m := stepFunctionsARN.FindStringSubmatch(ref); m != nil {
		return "https://" + m[1] + ".console.aws.amazon.com/states/home?region=" + m[1] + "#/v2/executions/details/" + url.PathEscape(ref)
	}
	if c.cfg.RefLink == "" || ref == "" {
		return ""
	}
	u := strings.ReplaceAll(c.cfg.RefLink, "{ref}", url.QueryEscape(ref))
	if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") {
		return ""
	}
	return u
}

// recordView is a record as the record page shows it.
type recordView struct {
	*idem.State
	// Status is the status's name. Every other field of the record is
	// the State's own: a field declared here hides it (a declared Owner
	// once showed "-" for every record).
	Status          string
	Stuck, Fresh    bool
	Age             time.Duration
	Result, ErrBody *body
	RefURL          string
	// Guard is the digest of the record as shown ([ops.Guard]): the
	// action forms carry it, and a write is refused unless the record
	// still has it.
	Guard      string
	CanRelease bool
	ExpiresIn  time.Duration
	// StepRows are the State's Steps as the page's table shows them (a
	// field named Steps would hide the State's).
	StepRows []stepRow
}

// stepRow is one finished step of an IN_PROGRESS record: its outcome's
// size, or its terminal error; not the recorded value.
type stepRow struct {
	Index       int
	Name        string
	At          time.Time
	ResultBytes int
	Err         *store.ErrorRecord
}

func (c *Console) viewOf(st *idem.State, now time.Time) recordView {
	v := recordView{State: st, Status: st.Status.String(), Stuck: st.Overdue(now),
		Fresh: st.Status == idem.StatusInProgress && !st.Overdue(now), Age: now.Sub(st.CreatedAt),
		Result: showResult(st.Result, c.cfg.MaxBody), RefURL: c.refURL(st.Ref), Guard: ops.Guard(st),
		CanRelease: st.Status != idem.StatusCompleted, ExpiresIn: st.ExpiresAt.Sub(now)}
	if st.Err != nil {
		v.ErrBody = showBody(st.Err.Body, c.cfg.MaxBody)
	}
	for i, s := range st.Steps {
		v.StepRows = append(v.StepRows, stepRow{Index: i, Name: s.Name, At: store.FromMillis(s.At), ResultBytes: len(s.Result), Err: s.Err})
	}
	return v
}

func (c *Console) parseKey(v string) (idem.StoreKey, error) {
	if v == "" {
		return idem.StoreKey{}, errors.New("key: missing; give the store key, operation[/tenant]#sha256-hex")
	}
	k, err := idem.ParseStoreKey(v)
	if err != nil {
		return idem.StoreKey{}, fmt.Errorf("key=%q is not a store key (operation[/tenant]#sha256-hex): %v", v, err)
	}
	return k, nil
}

// flashes are the messages a redirect after an action may ask for.
var flashes = map[string]string{
	"release":  "Released: the next call with this key runs the operation again.",
	"delete":   "Deleted: the next call with this key runs the operation again.",
	"complete": "Resolved as COMPLETED: calls with this key replay the result.",
	"fail":     "Resolved as FAILED: calls with this key get the error.",
}

func (c *Console) record(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	key, err := c.parseKey(q.Get("key"))
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err.Error())
		return
	}
	flash := flashes[q.Get("done")]
	ctx, cancel := storeCtx(r)
	defer cancel()
	st, err := c.op.Read(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		c.render(w, r, s, http.StatusNotFound, "record", "Record", map[string]any{"Key": key.String(), "Flash": flash})
		return
	}
	if err != nil {
		c.storeFailure(w, r, s, err)
		return
	}
	c.render(w, r, s, http.StatusOK, "record", "Record", map[string]any{"Key": key.String(), "Flash": flash, "R": c.viewOf(st, c.op.Now())})
}

// actions

// form is an action's form, as posted to confirm and act.
type form struct {
	Key, Guard, Action string
	Result, Code, Msg  string
	Raw, Force         bool
	Expiry             string
	key                idem.StoreKey
	write              ops.Write
}

// parseForm reads an action's form, naming the field that is wrong.
func (c *Console) parseForm(r *http.Request) (*form, error) {
	p := r.PostForm
	f := &form{Key: p.Get("key"), Guard: p.Get("guard"), Action: p.Get("action"), Result: p.Get("result"),
		Code: strings.TrimSpace(p.Get("code")), Msg: strings.TrimSpace(p.Get("message")), Expiry: strings.TrimSpace(p.Get("expiry")),
		Raw: p.Get("raw") != "", Force: p.Get("force") != ""}
	var err error
	if f.key, err = c.parseKey(f.Key); err != nil {
		return f, err
	}
	if f.Guard == "" {
		return f, errors.New("guard: missing; open the record again and start over")
	}
	a, err := ops.ParseAction(f.Action)
	if err != nil {
		return f, fmt.Errorf("action: %v", err)
	}
	f.write = ops.Write{Action: a, Force: f.Force}
	if f.Expiry != "" {
		d, err := time.ParseDuration(f.Expiry)
		if err != nil || d <= 0 {
			return f, fmt.Errorf("expiry=%q: want a positive duration such as 24h, or nothing to keep the record's own", f.Expiry)
		}
		f.write.Expiry = d
	}
	switch a {
	case ops.Complete:
		if strings.TrimSpace(f.Result) == "" {
			return f, errors.New("result: empty; give the result to store, such as {\"status\":\"paid\"}")
		}
		if !f.Raw && !json.Valid([]byte(f.Result)) {
			return f, errors.New("result: not valid JSON (tick \"store as is\" for an application with another codec)")
		}
		f.write.Result = []byte(f.Result)
	case ops.Fail:
		if f.Code == "" || f.Msg == "" {
			return f, errors.New("code and message: both are needed to fail a record, such as declined / card declined")
		}
		f.write.Error = &idem.TerminalError{Code: f.Code, Message: f.Msg}
	}
	if err := f.write.Validate(); err != nil {
		return f, err
	}
	return f, nil
}

// check reads the record the form is about and verifies it is still the
// one the operator saw (its guard) and that the write is allowed.
func (c *Console) check(w http.ResponseWriter, r *http.Request, s *session, f *form) (*idem.State, bool) {
	ctx, cancel := storeCtx(r)
	defer cancel()
	st, err := c.op.Read(ctx, f.key)
	if errors.Is(err, store.ErrNotFound) {
		c.refuse(w, r, s, f, nil, &ops.ChangedError{Key: f.Key})
		return nil, false
	}
	if err != nil {
		c.storeFailure(w, r, s, err)
		return nil, false
	}
	if ops.Guard(st) != f.Guard {
		c.refuse(w, r, s, f, st, &ops.ChangedError{Key: f.Key, Now: &ops.Seen{Status: st.Status, Fence: st.Fence, Owner: st.Owner}})
		return nil, false
	}
	if err := f.write.Allowed(st, c.op.Now()); err != nil {
		c.refuse(w, r, s, f, st, err)
		return nil, false
	}
	return st, true
}

// refuse answers 409 with why, and reports the refusal.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, s *session, f *form, st *idem.State, err error) {
	if r.URL.Path == c.cfg.BasePath+"act" {
		c.report(s, f, st, nil, "refused", err)
	}
	c.render(w, r, s, http.StatusConflict, "error", "Refused", map[string]any{"Status": http.StatusConflict, "StatusText": "Refused",
		"Message": err.Error() + " Nothing was written.", "Back": c.recordURL(f.Key)})
}

func (c *Console) confirm(w http.ResponseWriter, r *http.Request, s *session) {
	f, err := c.parseForm(r)
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err.Error())
		return
	}
	st, ok := c.check(w, r, s, f)
	if !ok {
		return
	}
	after := "absent (deleted)"
	if a := f.write.After(); a != 0 {
		after = a.String()
	}
	c.render(w, r, s, http.StatusOK, "confirm", "Confirm", map[string]any{"F": f, "R": c.viewOf(st, c.op.Now()),
		"Describe": f.write.Describe(st), "After": after, "Result": showBody(f.write.Result, c.cfg.MaxBody), "Expiry": f.write.ExpiryFor(st),
		"Back": c.recordURL(f.Key)})
}

func (c *Console) act(w http.ResponseWriter, r *http.Request, s *session) {
	f, err := c.parseForm(r)
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err.Error())
		return
	}
	st, ok := c.check(w, r, s, f)
	if !ok {
		return
	}
	ctx, cancel := storeCtx(r)
	defer cancel()
	err = c.op.ApplyGuarded(ctx, f.key, f.Guard, f.write)
	var changed *ops.ChangedError
	var fresh *ops.FreshError
	switch {
	case errors.As(err, &changed) || errors.As(err, &fresh) || errors.Is(err, ops.ErrReleaseCompleted):
		c.refuse(w, r, s, f, st, err)
		return
	case err != nil:
		c.report(s, f, st, nil, "error", err)
		c.storeFailure(w, r, s, err)
		return
	}
	after := f.write.After()
	c.report(s, f, st, &after, "done", nil)
	http.Redirect(w, r, c.recordURL(f.Key, "done", f.Action), http.StatusSeeOther)
}

// report logs an action and hands it to OnAction.
func (c *Console) report(s *session, f *form, st *idem.State, after *idem.Status, outcome string, err error) {
	ev := ActionEvent{At: c.now(), Action: f.write.Action, Key: f.Key, Outcome: outcome, Err: err}
	if s != nil {
		ev.Who = s.user
	}
	if st != nil {
		ev.Before, ev.Fence = st.Status, st.Fence
		ev.After = st.Status
	}
	if after != nil {
		ev.After = *after
	}
	attrs := []any{"who", ev.Who, "action", string(ev.Action), "key", ev.Key, "fence", ev.Fence,
		"before", statusName(ev.Before), "after", statusName(ev.After), "outcome", outcome, "force", f.write.Force}
	if err != nil {
		c.cfg.Logger.Warn("idem console: action "+outcome, append(attrs, "err", err)...)
	} else {
		c.cfg.Logger.Info("idem console: action "+outcome, attrs...)
	}
	if c.cfg.OnAction != nil {
		c.cfg.OnAction(ev)
	}
}

func statusName(s idem.Status) string {
	if s == 0 {
		return "ABSENT"
	}
	return s.String()
}
