package store

import (
	"encoding/binary"
	"hash/crc32"
	"strconv"
)

// The binary record format, for stores that keep a record as one value
// (the embedded file store among them):
//
//	"IDR" format(1)                     magic and format byte
//	status(1) flags(1)                  flags: 1 = has result, 2 = has error,
//	                                    4 = held (Record.Hold), 8 = has steps
//	uvarint: fence, version
//	varint:  lease_until, expires_at, created_at, completed_at
//	bytes:   key, owner, fingerprint, ref            (uvarint length + bytes)
//	bytes:   result                                 (if flag 1)
//	bytes:   error code, message, body              (if flag 2)
//	steps                                           (if flag 4)
//	crc32c(4, big endian) of everything before
//
// steps are a uvarint count, then for each step: its flags(1) (1 = has
// result, 2 = has error), its name (bytes), at (varint), its result
// (bytes, if 1) and its error code, message and body (bytes, if 2). A
// record without steps is encoded as before steps existed.
//
// Decoding checks the magic, the checksum, every length and the status,
// and fails with [ErrCorrupt] rather than return a record it cannot vouch
// for.
const recordFormat = 1

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// MaxEncodedField bounds any one field of an encoded record (256 MiB).
const MaxEncodedField = 256 << 20

// MarshalRecord encodes r in the binary record format.
func MarshalRecord(r *Record) []byte {
	n := 64 + len(r.Key) + len(r.Owner) + len(r.Fingerprint) + len(r.Ref) + r.Size()
	if r.Err != nil {
		n += len(r.Err.Code)
	}
	for _, st := range r.Steps {
		n += 24
		if st.Err != nil {
			n += len(st.Err.Code)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, 'I', 'D', 'R', recordFormat, byte(r.Status))
	var flags byte
	if r.Result != nil {
		flags |= 1
	}
	if r.Err != nil {
		flags |= 2
	}
	if r.Hold {
		flags |= 4
	}
	if len(r.Steps) > 0 {
		flags |= 8
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, r.Fence)
	b = binary.AppendUvarint(b, uint64(r.Version))
	for _, v := range [...]int64{r.LeaseUntil, r.ExpiresAt, r.CreatedAt, r.CompletedAt} {
		b = binary.AppendVarint(b, v)
	}
	for _, s := range [...]string{r.Key, r.Owner, r.Fingerprint, r.Ref} {
		b = appendField(b, []byte(s))
	}
	if r.Result != nil {
		b = appendField(b, r.Result)
	}
	if r.Err != nil {
		b = appendField(b, []byte(r.Err.Code))
		b = appendField(b, []byte(r.Err.Message))
		b = appendField(b, r.Err.Body)
	}
	if len(r.Steps) > 0 {
		b = binary.AppendUvarint(b, uint64(len(r.Steps)))
		for _, st := range r.Steps {
			b = appendStep(b, st)
		}
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func appendStep(b []byte, st Step) []byte {
	var flags byte
	if st.Result != nil {
		flags |= 1
	}
	if st.Err != nil {
		flags |= 2
	}
	b = append(b, flags)
	b = appendField(b, []byte(st.Name))
	b = binary.AppendVarint(b, st.At)
	if st.Result != nil {
		b = appendField(b, st.Result)
	}
	if st.Err != nil {
		b = appendField(b, []byte(st.Err.Code))
		b = appendField(b, []byte(st.Err.Message))
		b = appendField(b, st.Err.Body)
	}
	return b
}

func appendField(b, f []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	return append(b, f...)
}

// UnmarshalRecord decodes a record written by [MarshalRecord]. The result
// shares no memory with data. Any defect yields a [*CorruptError].
func UnmarshalRecord(data []byte) (*Record, error) {
	d := recDecoder{b: data}
	if len(data) < 10 || string(data[:3]) != "IDR" {
		return nil, &CorruptError{Reason: "not an idem record (bad magic)"}
	}
	if data[3] != recordFormat {
		return nil, &CorruptError{Reason: "unknown record format " + strconv.Itoa(int(data[3]))}
	}
	body := data[:len(data)-4]
	if binary.BigEndian.Uint32(data[len(data)-4:]) != crc32.Checksum(body, crcTable) {
		return nil, &CorruptError{Reason: "checksum mismatch"}
	}
	d.b, d.pos = body, 4
	r := &Record{Status: Status(d.byte())}
	flags := d.byte()
	r.Fence = d.uvarint()
	r.Version = int(d.uvarint())
	r.LeaseUntil, r.ExpiresAt, r.CreatedAt, r.CompletedAt = d.varint(), d.varint(), d.varint(), d.varint()
	r.Key, r.Owner, r.Fingerprint, r.Ref = string(d.field()), string(d.field()), string(d.field()), string(d.field())
	if flags&1 != 0 {
		r.Result = d.field()
	}
	if flags&2 != 0 {
		r.Err = &ErrorRecord{Code: string(d.field()), Message: string(d.field()), Body: d.field()}
	}
	r.Hold = flags&4 != 0
	if flags&8 != 0 {
		r.Steps = d.steps()
	}
	switch {
	case d.err != "":
		return nil, &CorruptError{Key: r.Key, Reason: d.err}
	case d.pos != len(d.b):
		return nil, &CorruptError{Key: r.Key, Reason: "trailing bytes"}
	case flags&^15 != 0:
		return nil, &CorruptError{Key: r.Key, Reason: "unknown flags"}
	case flags&8 != 0 && len(r.Steps) == 0:
		return nil, &CorruptError{Key: r.Key, Reason: "steps flagged but none encoded"}
	case !r.Status.Valid():
		return nil, &CorruptError{Key: r.Key, Reason: "invalid status " + strconv.Itoa(int(r.Status))}
	case r.Version < 1:
		return nil, &CorruptError{Key: r.Key, Reason: "invalid version " + strconv.Itoa(r.Version)}
	}
	return r, nil
}

// steps decodes a record's steps (see the format above).
func (d *recDecoder) steps() []Step {
	n := d.uvarint()
	// Each step takes at least 3 bytes: flags, a name's length, at.
	if d.err != "" || n > uint64(len(d.b)-d.pos)/3 {
		if d.err == "" {
			d.err = "step count out of range"
		}
		return nil
	}
	steps := make([]Step, n)
	for i := range steps {
		flags := d.byte()
		st := Step{Name: string(d.field()), At: d.varint()}
		if flags&1 != 0 {
			st.Result = d.field()
		}
		if flags&2 != 0 {
			st.Err = &ErrorRecord{Code: string(d.field()), Message: string(d.field()), Body: d.field()}
		}
		if flags&^3 != 0 && d.err == "" {
			d.err = "unknown step flags"
		}
		if d.err != "" {
			return nil
		}
		steps[i] = st
	}
	return steps
}

type recDecoder struct {
	b   []byte
	pos int
	err string
}

func (d *recDecoder) byte() byte {
	if d.err != "" || d.pos >= len(d.b) {
		d.err = "truncated"
		return 0
	}
	c := d.b[d.pos]
	d.pos++
	return c
}

func (d *recDecoder) uvarint() uint64 {
	if d.err != "" {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.pos:])
	if n <= 0 {
		d.err = "bad varint"
		return 0
	}
	d.pos += n
	return v
}

func (d *recDecoder) varint() int64 {
	if d.err != "" {
		return 0
	}
	v, n := binary.Varint(d.b[d.pos:])
	if n <= 0 {
		d.err = "bad varint"
		return 0
	}
	d.pos += n
	return v
}

func (d *recDecoder) field() []byte {
	n := d.uvarint()
	if d.err != "" {
		return nil
	}
	if n > MaxEncodedField || n > uint64(len(d.b)-d.pos) {
		d.err = "field length out of range"
		return nil
	}
	f := make([]byte, n)
	copy(f, d.b[d.pos:])
	d.pos += int(n)
	return f
}
