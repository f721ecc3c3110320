package idemrpc

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"google.golang.org/genproto/googleapis/rpc/code"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
)

// Call is one call as a transport received it.
type Call struct {
	// Method is the full method name, "/shop.v1.Orders/Create".
	Method string
	// Descriptor is the method's descriptor when the transport has it
	// (Connect's Spec.Schema); nil otherwise.
	Descriptor protoreflect.MethodDescriptor
	// Metadata returns the values of a request metadata entry, by its
	// lower-case name.
	Metadata func(name string) []string
	// Request is the request message; a covered call needs a
	// proto.Message.
	Request any
	// StatusOf returns the status of an error the handler returned (gRPC:
	// status.FromError; Connect: its code, message and details).
	StatusOf func(error) *spb.Status
}

// Outcome is the answer to a call that did not fail.
type Outcome struct {
	// Response is the handler's response, or the stored one on a replay,
	// decoded into its message type.
	Response proto.Message
	// Replayed is true when the answer, a response or a terminal error,
	// was stored by an earlier call: the transport marks it with
	// [ReplayedMetadata].
	Replayed bool
	// Ran is true when the handler ran in this call: the error returned
	// with it is then the handler's own, to be passed on as it is. When
	// Ran is false a non-nil error is the Guard's or the engine's, for
	// [StatusFor].
	Ran bool
	// Terminal is set when the handler ran and returned an error the
	// Guard stored as terminal: the status stored, the one inside the
	// error (code, message, details; text wrapped around it dropped).
	// The transport answers with it, so the first caller gets what every
	// replay will get.
	Terminal *spb.Status
}

// Handler runs the call's handler: the next interceptor or the method.
type Handler func(ctx context.Context) (proto.Message, error)

// Do runs one call under the Guard's rules: a call of a method that is not
// covered, or without a key where none is required, runs the handler
// directly; a covered call with a key runs it at most once per key (see
// the package documentation for every answer).
func (g *Guard) Do(ctx context.Context, c Call, handler Handler) (Outcome, error) {
	m, err := g.rules(c.Method, c.Descriptor, false)
	if err != nil {
		return Outcome{}, err
	}
	if m == nil {
		resp, err := handler(ctx)
		return Outcome{Response: resp, Ran: true}, err
	}
	key, err := ParseKey(c.Metadata(g.cfg.KeyMetadata))
	if errors.Is(err, ErrMissingKey) && !m.required {
		resp, err := handler(ctx)
		return Outcome{Response: resp, Ran: true}, err
	}
	if err != nil {
		return Outcome{}, err
	}
	req, ok := c.Request.(proto.Message)
	if !ok {
		return Outcome{}, &MessageError{Method: c.Method, Type: fmt.Sprintf("%T", c.Request)}
	}
	id, err := g.identity(ctx, m, key, req, c.Metadata)
	if err != nil {
		return Outcome{}, err
	}
	// One allocation holds the call's state, and is the context the
	// operation runs under: runCall, a plain function, finds it there (a
	// method value would be a second allocation).
	r := &run{Context: ctx, g: g, method: c.Method, statusOf: c.StatusOf, handler: handler}
	res, err := idem.DoIdentity(r, g.eng, id, runCall)
	if r.buf != nil {
		// The engine keeps a copy of the encoded response (JSONCodec,
		// the engine's default): the buffer is free again.
		buffers.Put(r.buf)
	}
	if r.ran {
		// The handler answered; what the engine made of it (stored,
		// released, kept) it logs itself.
		return Outcome{Response: r.resp, Ran: true, Terminal: r.terminal}, r.herr
	}
	if err != nil {
		var te *idem.TerminalError
		return Outcome{Replayed: errors.As(err, &te) && te.Replayed}, err
	}
	out, err := g.decodeResponse(id.StoreKey.String(), res.Value)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Response: out, Replayed: true}, nil
}

// run is a covered call's handler, run by the engine, and what it
// answered.
type run struct {
	context.Context // the call's: r is the context the operation runs under
	g               *Guard
	method          string
	statusOf        func(error) *spb.Status
	handler         Handler

	ran      bool
	resp     proto.Message
	herr     error
	terminal *spb.Status
	buf      *[]byte // the pooled buffer the response was encoded into, if any
}

// runKey is the context key under which a run finds itself.
type runKey struct{}

// Value implements context.Context: r under runKey, else the call's
// context's values.
func (r *run) Value(key any) any {
	if key == (runKey{}) {
		return r
	}
	return r.Context.Value(key)
}

// runCall is the operation of every call: it runs the run whose context
// ctx derives from.
func runCall(ctx context.Context) ([]byte, error) {
	return ctx.Value(runKey{}).(*run).Run(ctx)
}

// Run runs the handler and encodes its response for the store.
func (r *run) Run(ctx context.Context) ([]byte, error) {
	r.ran = true
	r.resp, r.herr = r.handler(ctx)
	if r.herr != nil {
		var err error
		r.terminal, err = r.g.outcomeError(r.herr, r.statusOf)
		return nil, err
	}
	if r.resp == nil {
		r.herr = fmt.Errorf("idemrpc: %s returned a nil response and a nil error", r.method)
		return nil, r.herr
	}
	var dst []byte
	if r.g.pooled {
		r.buf = buffers.Get().(*[]byte)
		dst = (*r.buf)[:0]
	}
	b, err := appendResponse(dst, r.resp)
	if err != nil {
		// The handler did its work: a retry must not run it again.
		return nil, idem.Terminal(err, CodeResponseUnencodable)
	}
	if r.buf != nil && cap(b) <= maxPooled {
		*r.buf = b
	}
	return b, nil
}

// outcomeError is what the engine gets of a handler's error: a terminal
// one (Config.Terminal, or marked with idem.Terminal) as an
// *idem.TerminalError whose Body is its google.rpc.Status, to be stored
// and replayed; any other as it is, to release the key (or keep it, for an
// uncertain outcome). For a terminal error it also returns the status
// stored.
func (g *Guard) outcomeError(err error, statusOf func(error) *spb.Status) (*spb.Status, error) {
	if errors.Is(err, idem.ErrUncertain) {
		return nil, err
	}
	st := statusOf(err)
	if st.GetCode() == int32(code.Code_OK) {
		st = &spb.Status{Code: int32(code.Code_UNKNOWN), Message: st.GetMessage(), Details: st.GetDetails()}
	}
	var marked *idem.TerminalError
	isMarked := errors.As(err, &marked)
	if !isMarked && !g.cfg.Terminal(code.Code(st.GetCode())) {
		return nil, err
	}
	body, merr := deterministic.Marshal(st)
	if merr != nil {
		body = nil // replayed as its code name and message only
	}
	c := TerminalCodePrefix + code.Code(st.GetCode()).String()
	if isMarked && marked.Code != "" {
		c = marked.Code
	}
	return st, &idem.TerminalError{Code: c, Message: st.GetMessage(), Body: body}
}

// TerminalCodePrefix prefixes the code of a stored terminal error that the
// Guard classified by its status code: "grpc.FAILED_PRECONDITION", as
// idemctl lists it. An error marked with [idem.Terminal] keeps its own
// code. Either way the error's Body is its google.rpc.Status, details
// included.
const TerminalCodePrefix = "grpc."

// CodeResponseUnencodable is the code of the terminal error stored when a
// handler's response cannot be encoded (proto.Marshal failed): the handler
// ran, so a retry must not run it again.
const CodeResponseUnencodable = "idemrpc.response_unencodable"

// identity derives the store key and fingerprint of a covered call.
func (g *Guard) identity(ctx context.Context, m *method, key string, req proto.Message, md func(string) []string) (idem.Identity, error) {
	tenant, err := g.tenant(ctx)
	if err != nil {
		return idem.Identity{}, err
	}
	// One buffer, reused from call to call, takes the fields in order, the
	// request's deterministic encoding marshalled into it in place after a
	// length patched in afterwards: no copy of the request's bytes.
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	b := field((*bp)[:0], m.name)
	at := len(b)
	b = binary.BigEndian.AppendUint64(b, 0)
	b, err = deterministic.MarshalAppend(b, req)
	if err != nil {
		return idem.Identity{}, &MessageError{Method: m.name, Type: string(req.ProtoReflect().Descriptor().FullName()), Err: err}
	}
	binary.BigEndian.PutUint64(b[at:], uint64(len(b)-at-8))
	for _, name := range m.fpNames {
		b = field(b, name)
		// The values joined by NUL, after their joined length.
		vs := md(name)
		n := max(len(vs)-1, 0)
		for _, v := range vs {
			n += len(v)
		}
		b = binary.BigEndian.AppendUint64(b, uint64(n))
		for i, v := range vs {
			if i > 0 {
				b = append(b, 0)
			}
			b = append(b, v...)
		}
	}
	if cap(b) <= maxPooled {
		*bp = b
	}
	// The store key is clientkey.RPC's, which idemctl find and the console
	// use too; it and the fingerprint take one allocation.
	id, err := clientkey.RPCIdentity(m.operation, tenant, key, sha256.Sum256(b))
	id.HoldCrashed = m.hold
	return id, err
}

// deterministic is the encoding of everything the Guard hashes or stores:
// stable for one message definition and one protobuf-go version.
var deterministic = proto.MarshalOptions{Deterministic: true}

// buffers are the buffers fingerprints are built in and responses encoded
// into; one that grew past maxPooled (a large message) is not kept.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const maxPooled = 64 << 10

// field appends s, after its length, so that no two field lists hash alike.
func field(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// tenant returns the tenant of the call's store keys: its principal,
// hashed (Config.Principal, clientkey.RPCTenant), or "" when there is
// none. The store key is clientkey.RPC's, which idemctl find and the
// console use too.
func (g *Guard) tenant(ctx context.Context) (string, error) {
	if g.cfg.Principal == nil {
		return "", nil
	}
	p, err := g.cfg.Principal(ctx)
	if err != nil {
		return "", &PrincipalError{Err: err}
	}
	if p == "" {
		return "", nil
	}
	return clientkey.RPCTenant(p), nil
}

// appendResponse appends the encoding of a response for the store to b: a
// google.protobuf.Any of its deterministic encoding, so a replay finds its
// type again. The Any (type_url = 1, value = 2, in field order, as
// deterministic marshalling writes it) is written by hand around the
// response's encoding, which is marshalled once, in place.
func appendResponse(b []byte, m proto.Message) ([]byte, error) {
	name := m.ProtoReflect().Descriptor().FullName()
	size := deterministic.Size(m)
	urlLen := len(typeURLPrefix) + len(name)
	b = slices.Grow(b, 2+protowire.SizeVarint(uint64(urlLen))+urlLen+protowire.SizeVarint(uint64(size))+size)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(urlLen))
	b = append(b, typeURLPrefix...)
	b = append(b, name...)
	if size == 0 {
		return b, nil // an empty value is not written, as for any proto3 field
	}
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	start := len(b)
	b, err := sized.MarshalAppend(b, m)
	if err != nil {
		return nil, err
	}
	if len(b)-start != size {
		return nil, fmt.Errorf("idemrpc: %s encoded to %d bytes, sized %d", name, len(b)-start, size)
	}
	return b, nil
}

// sized is deterministic marshalling after a Size call: the sizes it
// cached are not computed again.
var sized = proto.MarshalOptions{Deterministic: true, UseCachedSize: true}

// intoNew decodes into a new message: there is nothing to reset first.
var intoNew = proto.UnmarshalOptions{Merge: true}

const typeURLPrefix = "type.googleapis.com/"

// decodeResponse decodes a stored response (an Any, see appendResponse)
// into a new message of its type (Config.Types). The Any is read in place:
// the type URL and the value are read from b, not from copies. b is the
// call's own copy of the stored bytes (idem.Result.Value), never written
// to, so the type URL may stay a view of it.
func (g *Guard) decodeResponse(key string, b []byte) (proto.Message, error) {
	rawURL, value, err := readAny(b)
	if err != nil {
		return nil, &ResponseError{Key: key, Err: err}
	}
	url := unsafe.String(unsafe.SliceData(rawURL), len(rawURL))
	mt, err := g.cfg.Types.FindMessageByURL(url)
	if err != nil {
		return nil, &ResponseError{Key: key, Type: url, Err: err}
	}
	m := mt.New().Interface()
	if err := intoNew.Unmarshal(value, m); err != nil {
		return nil, &ResponseError{Key: key, Type: url, Err: err}
	}
	return m, nil
}

// readAny reads the type URL and value of an encoded google.protobuf.Any,
// as proto.Unmarshal would (the last of a repeated field wins; unknown
// fields are skipped), without allocating the Any or copying its fields:
// both are slices of b.
func readAny(b []byte) (url, value []byte, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case (num == 1 || num == 2) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			if num == 1 {
				url = v
			} else {
				value = v
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, nil, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return url, value, nil
}
