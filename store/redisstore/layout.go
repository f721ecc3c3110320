package redisstore

import (
	"strconv"
	"strings"

	"github.com/seed-a1b882c0/idem/store"
)

// A record is one Redis string, laid out so that a claim of an absent key
// is a plain SET NX and a fenced write can check the claim by comparing a
// prefix, without decoding the record:
//
//	'R' fence ':' len(owner) ':' owner     the tag: the claim the record holds
//	status                                 one digit: 1, 2 or 3
//	expires_at ';'
//	len(keep) ':' keep                     kept by Complete and Fail:
//	    ['h'] lease_until ';' created_at ';' version ';' len(fp) ':' fp ref
//	    ('h': the claim is held, Record.Hold: not taken over past its lease)
//	completed_at ';'
//	payload                                COMPLETED: the result;
//	                                       FAILED: len(code) ':' code len(msg) ':' msg body
//	                                       IN_PROGRESS: the steps, or nothing
//
// An IN_PROGRESS record's steps (store.Stepper) are
//
//	count ';' size ';' step…                size: the steps' store.Step.Size, summed
//
// and each step is
//
//	len(name) ':' name at ';' kind          kind: 'n' (no result, no error),
//	    'r' len(result) ':' result           a result,
//	    'e' len(code) ':' code len(msg) ':' msg len(body) ':' body   a terminal error
//
// A record without steps has no payload: it is laid out as before steps
// existed. Complete and Fail replace the payload (the steps go), Extend
// keeps it, and a takeover with the record's own fingerprint copies it
// into the new claim (claim.lua).
//
// Numbers are decimal.

// appendTag appends the tag of the claim (fence, owner).
func appendTag(b []byte, fence uint64, owner string) []byte {
	b = append(b, 'R')
	b = strconv.AppendUint(b, fence, 10)
	return appendOwner(b, owner)
}

func appendOwner(b []byte, owner string) []byte {
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(len(owner)), 10)
	b = append(b, ':')
	return append(b, owner...)
}

// appendClaimRest appends what follows the fence digits in a new
// IN_PROGRESS record for p.
func appendClaimRest(b []byte, p store.ClaimParams) []byte {
	b = appendOwner(b, p.Owner)
	b = append(b, '1')
	b = strconv.AppendInt(b, p.ExpiresAt, 10)
	b = append(b, ';')
	var keep [160]byte
	k := keep[:0]
	if p.Hold {
		k = append(k, 'h')
	}
	k = strconv.AppendInt(k, p.LeaseUntil, 10)
	k = append(k, ';')
	k = strconv.AppendInt(k, p.Now, 10)
	k = append(k, ';')
	k = strconv.AppendInt(k, store.RecordVersion, 10)
	k = append(k, ';')
	k = strconv.AppendInt(k, int64(len(p.Fingerprint)), 10)
	k = append(k, ':')
	k = append(k, p.Fingerprint...)
	b = strconv.AppendInt(b, int64(len(k)), 10)
	b = append(b, ':')
	b = append(b, k...)
	return append(b, "0;"...)
}

// encodeClaim returns a new IN_PROGRESS record for p with fence 1.
func encodeClaim(p store.ClaimParams) []byte {
	b := make([]byte, 0, 64+len(p.Owner)+len(p.Fingerprint))
	b = append(b, 'R', '1')
	return appendClaimRest(b, p)
}

// completeTail is the tail the settle script appends for Complete:
// completed_at ';' result.
func completeTail(now int64, result []byte) []byte {
	b := make([]byte, 0, 24+len(result))
	b = strconv.AppendInt(b, now, 10)
	b = append(b, ';')
	return append(b, result...)
}

// failTail is the tail for Fail: completed_at ';' the error.
func failTail(now int64, e store.ErrorRecord) []byte {
	b := make([]byte, 0, 32+len(e.Code)+len(e.Message)+len(e.Body))
	b = strconv.AppendInt(b, now, 10)
	b = append(b, ';')
	for _, s := range [...]string{e.Code, e.Message} {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	return append(b, e.Body...)
}

// decoder reads a record's value front to back; the first failure sticks.
type decoder struct {
	v   string
	bad string // the part that failed to decode
}

func (d *decoder) fail(part string) {
	if d.bad == "" {
		d.bad = part
	}
}

// until returns the text up to sep and moves past it.
func (d *decoder) until(sep byte, part string) string {
	i := strings.IndexByte(d.v, sep)
	if i < 0 {
		d.fail(part)
		return ""
	}
	s := d.v[:i]
	d.v = d.v[i+1:]
	return s
}

func (d *decoder) int(sep byte, part string) int64 {
	n, err := strconv.ParseInt(d.until(sep, part), 10, 64)
	if err != nil {
		d.fail(part)
	}
	return n
}

// sized returns a len ':' bytes field.
func (d *decoder) sized(part string) string {
	n := d.int(':', part)
	if n < 0 || n > int64(len(d.v)) {
		d.fail(part)
		return ""
	}
	s := d.v[:n]
	d.v = d.v[n:]
	return s
}

// decodeValue reads a record in the string layout. A damaged record fails
// closed.
func decodeValue(key, v string) (*store.Record, error) {
	if len(v) == 0 || v[0] != 'R' {
		return nil, &store.CorruptError{Key: key, Reason: "record layout not recognised"}
	}
	d := decoder{v: v[1:]}
	r := &store.Record{Key: key}
	f := d.int(':', "fence")
	r.Owner = d.sized("owner")
	if f < 1 {
		d.fail("fence")
	}
	r.Fence = uint64(f)
	if d.bad == "" {
		if len(d.v) == 0 {
			d.fail("status")
		} else {
			r.Status = store.Status(d.v[0] - '0')
			d.v = d.v[1:]
		}
	}
	if !r.Status.Valid() {
		d.fail("status")
	}
	r.ExpiresAt = d.int(';', "expires_at")
	keep := decoder{v: d.sized("keep")}
	if strings.HasPrefix(keep.v, "h") {
		r.Hold, keep.v = true, keep.v[1:]
	}
	r.LeaseUntil = keep.int(';', "lease_until")
	r.CreatedAt = keep.int(';', "created_at")
	r.Version = int(keep.int(';', "version"))
	r.Fingerprint = keep.sized("fingerprint")
	r.Ref = keep.v
	d.fail(keep.bad)
	if r.Version != store.RecordVersion {
		d.fail("version")
	}
	r.CompletedAt = d.int(';', "completed_at")
	if d.bad != "" {
		return nil, &store.CorruptError{Key: key, Reason: "record " + d.bad + " missing or malformed"}
	}
	switch r.Status {
	case store.StatusCompleted:
		r.Result = []byte(d.v)
	case store.StatusFailed:
		r.Err = &store.ErrorRecord{Code: d.sized("error code"), Message: d.sized("error message")}
		if d.v != "" {
			r.Err.Body = []byte(d.v)
		}
		if d.bad != "" {
			return nil, &store.CorruptError{Key: key, Reason: "record " + d.bad + " missing or malformed"}
		}
	default:
		if d.v != "" {
			steps, err := decodeSteps(key, d.v)
			if err != nil {
				return nil, err
			}
			r.Steps = steps
		}
	}
	return r, nil
}

// appendStep appends st in the layout of one step.
func appendStep(b []byte, st store.Step) []byte {
	b = appendSized(b, st.Name)
	b = strconv.AppendInt(b, st.At, 10)
	b = append(b, ';')
	switch {
	case st.Err != nil:
		b = append(b, 'e')
		b = appendSized(b, st.Err.Code)
		b = appendSized(b, st.Err.Message)
		return appendSized(b, string(st.Err.Body))
	case st.Result != nil:
		b = append(b, 'r')
		return appendSized(b, string(st.Result))
	}
	return append(b, 'n')
}

// encodeStep returns st in the layout of one step.
func encodeStep(st store.Step) []byte {
	n := 48 + len(st.Name) + len(st.Result)
	if st.Err != nil {
		n += len(st.Err.Code) + len(st.Err.Message) + len(st.Err.Body)
	}
	return appendStep(make([]byte, 0, n), st)
}

func appendSized(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// decodeSteps reads an IN_PROGRESS record's payload: its steps. The
// count and the size must agree with the steps.
func decodeSteps(key, v string) ([]store.Step, error) {
	d := decoder{v: v}
	count := d.int(';', "step count")
	size := d.int(';', "step size")
	if d.bad == "" && (count < 1 || count > int64(len(d.v))/5) { // a step takes at least 5 bytes
		d.fail("step count")
	}
	var steps []store.Step
	total := int64(0)
	for i := int64(0); d.bad == "" && i < count; i++ {
		st := store.Step{Name: d.sized("step name"), At: d.int(';', "step time")}
		if d.bad != "" || len(d.v) == 0 {
			d.fail("step kind")
			break
		}
		kind := d.v[0]
		d.v = d.v[1:]
		switch kind {
		case 'n':
		case 'r':
			st.Result = []byte(d.sized("step result"))
		case 'e':
			st.Err = &store.ErrorRecord{Code: d.sized("step error code"), Message: d.sized("step error message")}
			if body := d.sized("step error body"); body != "" {
				st.Err.Body = []byte(body)
			}
		default:
			d.fail("step kind")
		}
		total += int64(st.Size())
		steps = append(steps, st)
	}
	switch {
	case d.bad != "":
		return nil, &store.CorruptError{Key: key, Reason: "record " + d.bad + " missing or malformed"}
	case d.v != "":
		return nil, &store.CorruptError{Key: key, Reason: "record steps followed by trailing bytes"}
	case total != size:
		return nil, &store.CorruptError{Key: key, Reason: "record step size does not match its steps"}
	}
	return steps, nil
}
