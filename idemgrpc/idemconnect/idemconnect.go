// Package idemconnect applies idem's rules for idempotent RPCs to Connect
// (connectrpc.com/connect) handlers and clients, through interceptors.
//
// The rules, and the one mapping of every answer to a status code, are
// package idemrpc's, which the gRPC interceptors (package idemgrpc) share:
// a service served over both answers alike, and a key sent to one is the
// same key to the other. Over Connect's protocol the key is the HTTP
// header Idempotency-Key (idemrpc.DefaultKeyMetadata, as idemhttp reads
// it), and a replay is marked with the response header
// Idempotent-Replayed: true.
//
//	g, err := idemrpc.New(engine, &idemrpc.Config{
//		Methods: map[string]idemrpc.Method{ordersv1connect.OrdersCreateProcedure: {Required: true}},
//	})
//	path, h := ordersv1connect.NewOrdersHandler(svc, connect.WithInterceptors(idemconnect.NewInterceptor(g)))
//
// # Replayed responses
//
// On a replay the handler does not run, so there is no *connect.Response
// of the method's type to return: the interceptor returns a
// *connect.Response whose message is a [*ReplayedMessage] holding the
// stored response, decoded into its own type, which encodes as that
// message (in binary and JSON alike). Interceptors outside this one that read a
// response's message should accept a proto.Message, or unwrap a
// *ReplayedMessage.
package idemconnect

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
)

// ReplayedHeader is the response header set to "true" on a replay.
const ReplayedHeader = "Idempotent-Replayed"

// ReplayedMessage is the message of a replayed response: the stored
// response, decoded into its own message type. It is a proto.Message that
// encodes as Message.
type ReplayedMessage struct {
	proto.Message
}

// Interceptor applies a Guard's rules to the unary handlers it intercepts,
// and refuses the streaming procedures named in Config.Methods. On a
// client it does nothing: use [NewClientInterceptor] there.
type Interceptor struct {
	g *idemrpc.Guard
}

// NewInterceptor returns the handler interceptor of g.
func NewInterceptor(g *idemrpc.Guard) *Interceptor { return &Interceptor{g: g} }

// WrapUnary implements connect.Interceptor.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if spec.IsClient {
			return next(ctx, req)
		}
		md, _ := spec.Schema.(protoreflect.MethodDescriptor)
		h := req.Header()
		var raw connect.AnyResponse
		out, err := i.g.Do(ctx, idemrpc.Call{
			Method:     spec.Procedure,
			Descriptor: md,
			Metadata:   h.Values,
			Request:    req.Any(),
			StatusOf:   StatusOf,
		}, func(ctx context.Context) (proto.Message, error) {
			var err error
			raw, err = next(ctx, req)
			if raw == nil {
				return nil, err
			}
			m, _ := raw.Any().(proto.Message)
			return m, err
		})
		if out.Ran {
			if out.Terminal != nil {
				return nil, ErrorOf(out.Terminal)
			}
			if raw == nil {
				return nil, err
			}
			return raw, err
		}
		if err != nil {
			ce := ErrorOf(i.g.Status(ctx, spec.Procedure, err))
			if out.Replayed {
				ce.Meta().Set(ReplayedHeader, "true")
			}
			return nil, ce
		}
		res := connect.NewResponse(&ReplayedMessage{Message: out.Response})
		res.Header().Set(ReplayedHeader, "true")
		return res, nil
	}
}

// WrapStreamingClient implements connect.Interceptor: streams pass
// through.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor: a streaming
// procedure named in Config.Methods is refused with UNIMPLEMENTED (an
// *idemrpc.StreamingMethodError, logged); other streams pass through.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		proc := conn.Spec().Procedure
		if _, err := i.g.Covered(proc, true); err != nil {
			return ErrorOf(i.g.Status(ctx, proc, err))
		}
		return next(ctx, conn)
	}
}

// ClientInterceptor gives each unary call of a Connect client an
// idempotency key (see [NewClientInterceptor]).
type ClientInterceptor struct {
	c *idemrpc.Client
}

// NewClientInterceptor returns the client interceptor that gives each
// unary call a key, unless its request header has one already: the
// DownstreamKey of the idem operation the call is made from, or a new key
// (idemrpc.Client.Key). Connect clients do not retry by themselves; an
// application that does sets the key once, in the request's header, and
// sends that request again.
func NewClientInterceptor(c *idemrpc.Client) *ClientInterceptor { return &ClientInterceptor{c: c} }

// WrapUnary implements connect.Interceptor.
func (i *ClientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if spec.IsClient && req.Header().Get(i.c.KeyMetadata()) == "" {
			if key, ok := i.c.Key(ctx, spec.Procedure); ok {
				req.Header().Set(i.c.KeyMetadata(), key)
			}
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor: streams pass
// through.
func (i *ClientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor: streams pass
// through.
func (i *ClientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// StatusOf returns the google.rpc.Status of an error a handler returned:
// a *connect.Error's code, message and details (connect.CodeOf finds one
// wrapped inside err), CANCELLED or DEADLINE_EXCEEDED for a context
// error, UNKNOWN for any other.
func StatusOf(err error) *spb.Status {
	var ce *connect.Error
	if errors.As(err, &ce) {
		st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
		for _, d := range ce.Details() {
			st.Details = append(st.Details, &anypb.Any{TypeUrl: typeURLPrefix + d.Type(), Value: d.Bytes()})
		}
		return st
	}
	c := connect.CodeUnknown
	switch {
	case errors.Is(err, context.Canceled):
		c = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		c = connect.CodeDeadlineExceeded
	}
	return &spb.Status{Code: int32(c), Message: err.Error()}
}

const typeURLPrefix = "type.googleapis.com/"

// ErrorOf returns st as a *connect.Error, details included.
func ErrorOf(st *spb.Status) *connect.Error {
	ce := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, a := range st.GetDetails() {
		if d, err := connect.NewErrorDetail(a); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}
