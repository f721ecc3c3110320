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
			return nil, &store.CorruptError{Key: key, Reason: "IN_PROGRESS record with a payload"}
		}
	}
	return r, nil
}
