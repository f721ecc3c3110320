package main

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/idemsfn"
)

// operation is the idem operation of transfers.
const operation = "transfer"

// statusPath is where a transfer's status is served: statusPath + the hex
// digest of its key.
const statusPath = "/transfers/status/"

// API serves POST /transfers and the status resource.
type API struct {
	Engine  *idem.Engine
	Starter *idemsfn.Starter
	Log     *slog.Logger
}

func (a *API) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", a.create)
	mux.HandleFunc("GET "+statusPath+"{id}", a.status)
	return mux
}

// client is who calls: the scope of keys and status resources. A real
// service takes it from its authentication.
func client(r *http.Request) string { return r.Header.Get("X-Client") }

// create starts the transfer's workflow once per Idempotency-Key:
//
//	first request         → 202, Location of the status resource
//	duplicate, running    → 202, the same Location and execution
//	duplicate, completed  → 201, the receipt, Idempotent-Replayed: true
//	duplicate, failed     → 422, the stored failure, Idempotent-Replayed: true
func (a *API) create(w http.ResponseWriter, r *http.Request) {
	key, err := idemhttp.ParseHeader(r.Header.Values(idemhttp.HeaderName))
	if err != nil {
		problem(w, r, http.StatusBadRequest, "invalid-key", err.Error())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		problem(w, r, http.StatusRequestEntityTooLarge, "body-too-large", err.Error())
		return
	}
	var tr Transfer
	if err := json.Unmarshal(body, &tr); err != nil || tr.From == "" || tr.To == "" || tr.From == tr.To || tr.Amount <= 0 {
		problem(w, r, http.StatusBadRequest, "invalid-transfer", "want {\"from\", \"to\", \"amount\"}: two accounts and a positive amount in cents")
		return
	}
	req := idem.Request{Operation: operation, Tenant: client(r), Key: key, Payload: body}
	st, err := a.Starter.Start(r.Context(), req, tr)
	var term *idem.TerminalError
	switch {
	case errors.As(err, &term):
		w.Header().Set("Idempotent-Replayed", "true")
		problem(w, r, http.StatusUnprocessableEntity, "transfer-failed", term.Code+": "+term.Message)
	case errors.Is(err, idem.ErrMismatch):
		problem(w, r, http.StatusUnprocessableEntity, "key-reused", "this Idempotency-Key was used for another transfer")
	case errors.Is(err, idem.ErrInvalidKey):
		problem(w, r, http.StatusBadRequest, "invalid-key", err.Error())
	case err != nil:
		a.Log.Error("starting a transfer", "err", err)
		w.Header().Set("Retry-After", "1")
		problem(w, r, http.StatusServiceUnavailable, "unavailable", "the transfer could not be started; retry with the same Idempotency-Key")
	case st.State.Status == idem.StatusCompleted:
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(st.Output)
	default:
		k, _ := idem.ParseStoreKey(st.State.Key)
		w.Header().Set("Location", statusPath+k.Digest)
		w.Header().Set("Retry-After", idemhttp.RetryAfter(st.State.LeaseUntil.Sub(a.Engine.Now())))
		writeJSON(w, http.StatusAccepted, statusOf(st.State))
	}
}

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// status serves a transfer's status to the client that asked for it.
func (a *API) status(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !hexDigest.MatchString(id) {
		problem(w, r, http.StatusNotFound, "status-not-found", "no such transfer")
		return
	}
	st, err := a.Engine.Status(r.Context(), idem.StoreKey{Operation: operation, Tenant: client(r), Digest: id})
	switch {
	case errors.Is(err, idem.ErrNotFound):
		problem(w, r, http.StatusNotFound, "status-not-found", "no such transfer")
	case err != nil:
		problem(w, r, http.StatusServiceUnavailable, "unavailable", err.Error())
	default:
		writeJSON(w, http.StatusOK, statusOf(st))
	}
}

// Status is the status resource of a transfer.
type Status struct {
	Status             string          `json:"status"`
	Execution          string          `json:"execution,omitempty"`
	Created            time.Time       `json:"created"`
	ExpectedCompletion time.Time       `json:"expected_completion"`
	CompletedAt        *time.Time      `json:"completed_at,omitempty"`
	Result             json.RawMessage `json:"result,omitempty"`
	Error              string          `json:"error,omitempty"`
}

func statusOf(st *idem.State) Status {
	s := Status{Status: st.Status.String(), Execution: st.Ref, Created: st.CreatedAt.UTC(), ExpectedCompletion: st.LeaseUntil.UTC()}
	if !st.CompletedAt.IsZero() {
		t := st.CompletedAt.UTC()
		s.CompletedAt = &t
	}
	switch st.Status {
	case idem.StatusCompleted:
		_ = st.Decode(&s.Result)
	case idem.StatusFailed:
		s.Error = st.Err.Code + ": " + st.Err.Message
	}
	return s
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, r *http.Request, code int, name, detail string) {
	idemhttp.WriteProblem(w, r, idemhttp.Problem{Type: "urn:payments:problem:" + name, Title: http.StatusText(code), Status: code, Detail: detail})
}
