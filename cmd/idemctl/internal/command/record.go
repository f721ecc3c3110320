package command

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/store"
)

// keyFlags name a key by its parts, as an alternative to the store key:
// --scope OPERATION[/TENANT] --key MATERIAL [--tenant TENANT].
type keyFlags struct{ scope, key, tenant string }

func (k *keyFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&k.scope, "scope", "", "the key's operation (`NAME`, or NAME/TENANT), with --key instead of a store key")
	fs.StringVar(&k.key, "key", "", "the idempotency key `MATERIAL` the caller gave (hashed into the store key), with --scope")
	fs.StringVar(&k.tenant, "tenant", "", "the key's `TENANT`, with --scope and --key")
}

// storeKey returns the key named by the one positional argument (a store
// key, "operation[/tenant]#digest") or by --scope and --key.
func (k *keyFlags) storeKey(pos []string) (idem.StoreKey, error) {
	byParts := k.scope != "" || k.key != "" || k.tenant != ""
	switch {
	case len(pos) > 1:
		return idem.StoreKey{}, usagef("one key please, not %d arguments", len(pos))
	case len(pos) == 1 && byParts:
		return idem.StoreKey{}, usagef("give either a store key or --scope and --key, not both")
	case len(pos) == 1:
		sk, err := idem.ParseStoreKey(pos[0])
		if err != nil {
			return idem.StoreKey{}, usagef("%q is not a store key (operation[/tenant]#sha256-hex, as list prints): %v", pos[0], err)
		}
		return sk, nil
	case !byParts:
		return idem.StoreKey{}, usagef("which key? give a store key, or --scope and --key")
	case k.scope == "" || k.key == "":
		return idem.StoreKey{}, usagef("--scope and --key go together")
	}
	op, tenant, hasTenant := strings.Cut(k.scope, "/")
	if hasTenant && k.tenant != "" && k.tenant != tenant {
		return idem.StoreKey{}, usagef("--scope %s names tenant %q and --tenant says %q", k.scope, tenant, k.tenant)
	}
	if !hasTenant {
		tenant = k.tenant
	}
	sk, err := idem.NewStoreKey(op, tenant, []byte(k.key))
	if err != nil {
		return idem.StoreKey{}, usagef("%v", err)
	}
	return sk, nil
}

// view is a record as idemctl prints it.
type view struct {
	Key         string     `json:"key"`
	Status      string     `json:"status"`
	Stuck       bool       `json:"stuck"`
	Held        bool       `json:"held,omitempty"` // stuck under the takeover policy Hold: waits for a person
	Fence       uint64     `json:"fence"`
	Owner       string     `json:"owner"`
	Ref         string     `json:"execution_ref,omitempty"`
	Fingerprint string     `json:"fingerprint,omitempty"`
	Created     time.Time  `json:"created"`
	LeaseUntil  time.Time  `json:"lease_until"`
	Completed   *time.Time `json:"completed,omitempty"`
	Expires     time.Time  `json:"expires"`
	AgeSeconds  int64      `json:"age_seconds"`
	Error       *viewError `json:"error,omitempty"`
	// Result is the stored result: JSON as is, other bytes as a string.
	Result json.RawMessage `json:"result,omitempty"`
	// Response is Result read as the HTTP response idemhttp or
	// idem-gateway stored (idemhttp.ParseStored), its body shown as
	// Result is: a JSON body as JSON, not base64.
	Response *viewResponse `json:"response,omitempty"`
	// Steps are the finished steps of an IN_PROGRESS record (idem.Step),
	// in the order they ran: what a takeover resumes after.
	Steps []viewStep `json:"steps,omitempty"`
}

// viewStep is one finished step as idemctl prints it: its outcome's
// size or its terminal error, not the recorded value.
type viewStep struct {
	Index    int       `json:"index"`
	Name     string    `json:"name"`
	Recorded time.Time `json:"recorded"`
	// Outcome is "result" or "error".
	Outcome     string     `json:"outcome"`
	ResultBytes *int       `json:"result_bytes,omitempty"`
	Error       *viewError `json:"error,omitempty"`
}

// viewResponse is a stored HTTP response as idemctl prints it.
type viewResponse struct {
	Status int             `json:"status"`
	Header http.Header     `json:"header,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
}

type viewError struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

// viewOfRecord is r as idemctl prints it; withResult adds what show
// prints and list does not: the result (as a response when it is one)
// and the finished steps.
func viewOfRecord(r *store.Record, now time.Time, withResult bool) view {
	v := view{
		Key: r.Key, Status: r.Status.String(), Stuck: r.Status == store.StatusInProgress && r.LeaseExpired(store.Millis(now)),
		Fence: r.Fence, Owner: r.Owner, Ref: r.Ref, Fingerprint: r.Fingerprint,
		Created: store.FromMillis(r.CreatedAt).UTC(), LeaseUntil: store.FromMillis(r.LeaseUntil).UTC(),
		Expires: store.FromMillis(r.ExpiresAt).UTC(),
	}
	v.Held = v.Stuck && r.Hold
	v.AgeSeconds = int64(now.Sub(v.Created) / time.Second)
	if r.CompletedAt != 0 {
		t := store.FromMillis(r.CompletedAt).UTC()
		v.Completed = &t
	}
	if r.Err != nil {
		v.Error = &viewError{Code: r.Err.Code, Message: r.Err.Message}
	}
	if withResult && r.Status == store.StatusCompleted {
		v.Result = resultJSON(r.Result)
		if resp, ok := idemhttp.ParseStored(r.Result); ok {
			v.Response = &viewResponse{Status: resp.Status, Header: resp.Header, Body: resultJSON(resp.Body)}
		}
	}
	if withResult {
		for i, st := range r.Steps {
			vs := viewStep{Index: i, Name: st.Name, Recorded: store.FromMillis(st.At).UTC(), Outcome: "result"}
			if st.Err != nil {
				vs.Outcome, vs.Error = "error", &viewError{Code: st.Err.Code, Message: st.Err.Message}
			} else {
				n := len(st.Result)
				vs.ResultBytes = &n
			}
			v.Steps = append(v.Steps, vs)
		}
	}
	return v
}

func viewOfState(s *idem.State, now time.Time) view {
	r := &store.Record{
		Key: s.Key, Status: s.Status, Fence: s.Fence, Owner: s.Owner, Ref: s.Ref, Fingerprint: s.Fingerprint,
		CreatedAt: store.Millis(s.CreatedAt), LeaseUntil: store.Millis(s.LeaseUntil), ExpiresAt: store.Millis(s.ExpiresAt),
		Result: s.Result, Hold: s.Hold, Steps: s.Steps,
	}
	if !s.CompletedAt.IsZero() {
		r.CompletedAt = store.Millis(s.CompletedAt)
	}
	if s.Err != nil {
		r.Err = &store.ErrorRecord{Code: s.Err.Code, Message: s.Err.Message}
	}
	return viewOfRecord(r, now, true)
}

// resultJSON is b when it is JSON, else b as a JSON string (or base64
// when it is not UTF-8).
func resultJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) {
		return b
	}
	var s any = string(b)
	if !utf8.Valid(b) {
		s = map[string][]byte{"base64": b}
	}
	out, _ := json.Marshal(s)
	return out
}

// oneLine is b, JSON as resultJSON makes it, on one line for a table:
// compacted, with every control character (a terminal's escapes among
// them) written as a JSON escape, so the line stays valid JSON and prints
// nothing but itself.
func oneLine(b json.RawMessage) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		buf.Reset()
		buf.Write(b)
	}
	return escapeControls(buf.String())
}

// escapeControls is s with every control character (a terminal's escapes
// among them) written as a JSON escape, so that it prints nothing but
// itself on one line.
func escapeControls(s string) string {
	var out strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			fmt.Fprintf(&out, `\u%04x`, r)
			continue
		}
		out.WriteRune(r)
	}
	return out.String()
}

// headerLine is h on one line: "Name: value; Name: value", names sorted.
func headerLine(h http.Header) string {
	names := slices.Sorted(maps.Keys(h))
	var parts []string
	for _, name := range names {
		for _, v := range h[name] {
			parts = append(parts, name+": "+v)
		}
	}
	return oneLine(json.RawMessage(strings.Join(parts, "; ")))
}

// ts formats a time for tables.
func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeTable prints views as list's table.
func writeTable(w io.Writer, vs []view) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATUS\tOWNER\tCREATED\tEXPECTED COMPLETION\tAGE\tEXECUTION REF")
	for _, v := range vs {
		status := v.Status
		switch {
		case v.Held:
			status += " (stuck, held)"
		case v.Stuck:
			status += " (stuck)"
		}
		// The owner and the execution ref are text from the store (a ref
		// is the caller's): control characters escaped, as show does.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", escapeControls(v.Key), status, escapeControls(orDash(v.Owner)), ts(v.Created), ts(v.LeaseUntil),
			time.Duration(v.AgeSeconds)*time.Second, escapeControls(orDash(v.Ref)))
	}
	return tw.Flush()
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// outputFlag is -o table|json.
type outputFlag string

func (o *outputFlag) String() string { return string(*o) }

func (o *outputFlag) Set(s string) error {
	switch s {
	case "table", "json":
		*o = outputFlag(s)
		return nil
	}
	return fmt.Errorf("want table or json, not %q", s)
}
