package idemrpc

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/clientkey"
)

// DefaultKeyMetadata is the request metadata entry that carries the
// idempotency key: in gRPC metadata "idempotency-key", over Connect the
// HTTP header Idempotency-Key, the header idemhttp reads.
const DefaultKeyMetadata = "idempotency-key"

// ReplayedMetadata is the response metadata entry set to "true" on every
// replay, a stored response or a stored terminal error: a gRPC response
// header, a Connect response header (Idempotent-Replayed, as idemhttp
// sets it).
const ReplayedMetadata = "idempotent-replayed"

// MaxKeyLen is the longest idempotency key accepted, in bytes.
const MaxKeyLen = 255

// Config configures a [Guard]. A nil *Config means all defaults; every
// field documents its default. A Guard with no covered method lets every
// call through untouched, so set Methods or ByIdempotencyLevel.
type Config struct {
	// Methods are the covered methods, by full name
	// ("/shop.v1.Orders/Create", as gRPC's FullMethod and Connect's
	// Procedure spell it), each with its options. A method listed here is
	// covered whatever its descriptor says. A streaming method listed here
	// fails New with a [*StreamingMethodError] when its descriptor is
	// found in Files, and is refused at call time otherwise.
	Methods map[string]Method

	// ByIdempotencyLevel also covers every unary method whose descriptor
	// leaves the standard method option idempotency_level at
	// IDEMPOTENCY_UNKNOWN, the default of every method: a method marked
	// NO_SIDE_EFFECTS or IDEMPOTENT in its .proto file is safe to call
	// again by its own declaration and is not covered. These methods use
	// Default. The descriptor is the one Connect's generated code passes
	// (connect.Spec.Schema), else the one found in Files. Default false.
	ByIdempotencyLevel bool

	// Default is the options of the methods ByIdempotencyLevel covers;
	// its Operation must be empty (each method gets its own).
	Default Method

	// KeyMetadata is the metadata entry that carries the key, lower case.
	// Default [DefaultKeyMetadata].
	KeyMetadata string

	// Principal returns who is calling (the peer's mTLS identity, a
	// token's subject) from the call's context. It is part of the key's
	// scope, so two callers sending the same key never share a record or
	// see each other's responses. An error refuses the call with
	// UNAUTHENTICATED. Nil means every caller shares one key space: set it
	// in any service with more than one client.
	Principal func(ctx context.Context) (string, error)

	// Terminal decides, from the status code of an error the handler
	// returned, that the error is final for its key: it is stored and
	// replayed, code, message and details, to every retry. Any other error
	// releases the key so a retry runs the handler again. An error marked
	// with [idem.Terminal] is terminal whatever its code. Default
	// [DefaultTerminal].
	Terminal func(code.Code) bool

	// Files finds method descriptors by name, for ByIdempotencyLevel and
	// for the streaming check of Methods. Default protoregistry.GlobalFiles,
	// where generated code registers its files.
	Files *protoregistry.Files

	// Types finds the response message type of a stored response on
	// replay, by its type URL. Default protoregistry.GlobalTypes.
	Types protoregistry.MessageTypeResolver

	// StoreRetryAfter is the retry delay sent (google.rpc.RetryInfo) with
	// UNAVAILABLE when the store cannot be reached. Default 1s.
	StoreRetryAfter time.Duration

	// Logger receives refusals worth a look (a store outage, a stored
	// response that cannot be decoded). Default slog.Default().
	Logger *slog.Logger
}

// Method is the options of one covered method.
type Method struct {
	// Operation is the operation name of the method's store keys, which
	// observers label outcomes with. Methods that share an operation share
	// a key space. Default: the full method name without its leading
	// slash, the other slash a dot ("shop.v1.Orders.Create").
	Operation string

	// HoldCrashed sets the operation's takeover policy to Hold
	// (idem.Config.HoldCrashed): a key whose holder died is not run again
	// but held for a person; its duplicates get FAILED_PRECONDITION (StatusFor). Default false: the engine's policy.
	HoldCrashed bool

	// Required refuses a call without a key with INVALID_ARGUMENT. By
	// default such a call runs unprotected.
	Required bool

	// FingerprintMetadata are request metadata entries (lower case) whose
	// values are part of the request fingerprint, besides the request
	// message. A retry with the same key and other values is refused as a
	// reused key.
	FingerprintMetadata []string
}

// DefaultTerminal is the default Config.Terminal: INVALID_ARGUMENT,
// NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION and
// OUT_OF_RANGE are final, every other code releases the key. The package
// documentation gives the reasons.
func DefaultTerminal(c code.Code) bool {
	switch c {
	case code.Code_INVALID_ARGUMENT, code.Code_NOT_FOUND, code.Code_ALREADY_EXISTS,
		code.Code_PERMISSION_DENIED, code.Code_FAILED_PRECONDITION, code.Code_OUT_OF_RANGE:
		return true
	}
	return false
}

// StreamingMethodError is the configuration error of a streaming method
// named for coverage: idem covers unary methods only, since a stream has
// no one response to store and replay. It matches [idem.ErrInvalidConfig].
type StreamingMethodError struct {
	// Method is the method's full name.
	Method string
}

func (e *StreamingMethodError) Error() string {
	return fmt.Sprintf("idemrpc: %s is a streaming method; only unary methods can be covered: take it off Config.Methods", e.Method)
}

// Is makes errors.Is(err, idem.ErrInvalidConfig) true.
func (e *StreamingMethodError) Is(target error) bool { return target == idem.ErrInvalidConfig }

// Guard applies the idempotency rules to the calls of the methods it
// covers. The gRPC interceptors (package idemgrpc) and the Connect
// interceptor (package idemconnect) are thin layers over one Guard.
type Guard struct {
	eng     *idem.Engine
	cfg     Config
	methods map[string]*method
	// pooled: the engine's codec keeps a copy of a []byte result
	// (idem.JSONCodec), so responses are encoded into
	// pooled buffers.
	pooled bool
	// byLevel caches the methods ByIdempotencyLevel found covered.
	byLevel sync.Map // full name → *method
}

// method is a covered method's rules, resolved once.
type method struct {
	name      string
	operation string
	hold      bool
	required  bool
	fpNames   []string // sorted, unique
}

// New returns a Guard over eng. It fails with [idem.ErrInvalidConfig]
// naming a bad field, or with a [*StreamingMethodError].
func New(eng *idem.Engine, cfg *Config) (*Guard, error) {
	if eng == nil {
		return nil, fmt.Errorf("%w: idemrpc: engine is nil", idem.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.KeyMetadata == "" {
		c.KeyMetadata = DefaultKeyMetadata
	}
	if c.Terminal == nil {
		c.Terminal = DefaultTerminal
	}
	if c.Files == nil {
		c.Files = protoregistry.GlobalFiles
	}
	if c.Types == nil {
		c.Types = protoregistry.GlobalTypes
	}
	if c.StoreRetryAfter == 0 {
		c.StoreRetryAfter = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.KeyMetadata != strings.ToLower(c.KeyMetadata) || !validMetadataName(c.KeyMetadata):
		return nil, fmt.Errorf("%w: idemrpc: KeyMetadata %q must be a lower-case metadata name (a-z 0-9 - _ .)", idem.ErrInvalidConfig, c.KeyMetadata)
	case strings.HasSuffix(c.KeyMetadata, "-bin"):
		return nil, fmt.Errorf("%w: idemrpc: KeyMetadata %q names binary metadata; the key is text", idem.ErrInvalidConfig, c.KeyMetadata)
	case c.StoreRetryAfter < 0:
		return nil, fmt.Errorf("%w: idemrpc: StoreRetryAfter %v is negative", idem.ErrInvalidConfig, c.StoreRetryAfter)
	case c.Default.Operation != "":
		return nil, fmt.Errorf("%w: idemrpc: Default.Operation must be empty: each method ByIdempotencyLevel covers gets its own operation", idem.ErrInvalidConfig)
	}
	if _, err := newMethod("/Default/Default", c.Default); err != nil {
		return nil, err
	}
	g := &Guard{eng: eng, cfg: c, methods: make(map[string]*method, len(c.Methods))}
	switch eng.Config().Codec.(type) {
	case idem.JSONCodec:
		g.pooled = true
	}
	for _, name := range slices.Sorted(maps.Keys(c.Methods)) {
		m, err := newMethod(name, c.Methods[name])
		if err != nil {
			return nil, err
		}
		if md := g.descriptor(name); md != nil && (md.IsStreamingClient() || md.IsStreamingServer()) {
			return nil, &StreamingMethodError{Method: name}
		}
		g.methods[name] = m
	}
	return g, nil
}

// newMethod checks one method's options and resolves them.
func newMethod(name string, o Method) (*method, error) {
	defaultOp, ok := clientkey.RPCOperation(name)
	if !ok {
		return nil, fmt.Errorf("%w: idemrpc: method %q is not a full method name such as /shop.v1.Orders/Create", idem.ErrInvalidConfig, name)
	}
	op := o.Operation
	if op == "" {
		op = defaultOp
	}
	if _, err := idem.NewStoreKey(op, "", nil); err != nil {
		return nil, fmt.Errorf("%w: idemrpc: method %s: operation %q: %v (set Method.Operation)", idem.ErrInvalidConfig, name, op, err)
	}
	m := &method{name: name, operation: op, hold: o.HoldCrashed, required: o.Required}
	for _, n := range o.FingerprintMetadata {
		if n != strings.ToLower(n) || !validMetadataName(n) {
			return nil, fmt.Errorf("%w: idemrpc: method %s: FingerprintMetadata %q must be a lower-case metadata name", idem.ErrInvalidConfig, name, n)
		}
		m.fpNames = append(m.fpNames, n)
	}
	slices.Sort(m.fpNames)
	m.fpNames = slices.Compact(m.fpNames)
	return m, nil
}

// splitMethod splits "/pkg.Service/Method" into its service and method.
func splitMethod(name string) (svc, meth string, ok bool) { return clientkey.SplitMethod(name) }

// validMetadataName reports whether s is a valid gRPC metadata name.
func validMetadataName(s string) bool {
	if s == "" || strings.HasPrefix(s, "grpc-") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// descriptor returns the descriptor of the full method name from Files, or
// nil.
func (g *Guard) descriptor(name string) protoreflect.MethodDescriptor {
	svc, meth, ok := splitMethod(name)
	if !ok {
		return nil
	}
	d, err := g.cfg.Files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	return sd.Methods().ByName(protoreflect.Name(meth))
}

// rules returns the rules of the method name, or nil when it is not
// covered. md is the method's descriptor when the transport has it, else
// nil (it is then looked up in Files, when needed). A streaming method
// named in Methods fails with a [*StreamingMethodError].
func (g *Guard) rules(name string, md protoreflect.MethodDescriptor, streaming bool) (*method, error) {
	if m := g.methods[name]; m != nil {
		if streaming {
			return nil, &StreamingMethodError{Method: name}
		}
		return m, nil
	}
	if !g.cfg.ByIdempotencyLevel || streaming {
		return nil, nil
	}
	if m, ok := g.byLevel.Load(name); ok {
		return m.(*method), nil
	}
	if md == nil {
		md = g.descriptor(name)
	}
	if md == nil || md.IsStreamingClient() || md.IsStreamingServer() || !unknownLevel(md) {
		return nil, nil
	}
	m, err := newMethod(name, g.cfg.Default)
	if err != nil {
		return nil, err
	}
	g.byLevel.Store(name, m) // a method the descriptors know: a bounded set
	return m, nil
}

// unknownLevel reports whether md leaves idempotency_level unset.
func unknownLevel(md protoreflect.MethodDescriptor) bool {
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	return !ok || opts.GetIdempotencyLevel() == descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN
}

// Covered reports whether calls of the full method name are covered, as
// far as the Guard can tell without a call's descriptor; a streaming
// method named in Methods is reported with a [*StreamingMethodError].
func (g *Guard) Covered(name string, streaming bool) (bool, error) {
	m, err := g.rules(name, nil, streaming)
	return m != nil, err
}

// Config returns the Guard's configuration, with defaults filled in.
func (g *Guard) Config() Config { return g.cfg }
