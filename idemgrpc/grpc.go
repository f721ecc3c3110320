package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemgrpc/idemrpc"
)

// PushbackMetadata is the trailer through which a gRPC server tells a
// client's retry policy how long to wait before its next attempt (gRFC
// A6). Refusals that carry a google.rpc.RetryInfo detail (a duplicate in
// progress, a store outage) set it to the same delay.
const PushbackMetadata = "grpc-retry-pushback-ms"

// UnaryServerInterceptor returns the interceptor that applies g's rules to
// unary calls. Put it after the interceptors that authenticate the caller
// (Config.Principal reads what they put in the context) and before those
// that should run once per execution, not once per retry.
func UnaryServerInterceptor(g *idemrpc.Guard) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := req.(proto.Message); !ok {
			return unaryOther(ctx, g, req, info, handler)
		}
		// The protobuf codec's call: the handler's answer is a
		// proto.Message (or nil), the Outcome's Response.
		out, err := g.Do(ctx, call(ctx, req, info), func(ctx context.Context) (proto.Message, error) {
			resp, err := handler(ctx, req)
			m, _ := resp.(proto.Message)
			return m, err
		})
		if out.Ran && out.Terminal == nil {
			if out.Response == nil {
				return nil, err
			}
			return out.Response, err
		}
		return answer(ctx, g, info, out, err)
	}
}

// unaryOther is the interceptor for a call of another codec than
// protobuf's: the Guard runs it only when it does not cover it, and its
// answer, no proto.Message, goes back as it is.
func unaryOther(ctx context.Context, g *idemrpc.Guard, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var raw any
	out, err := g.Do(ctx, call(ctx, req, info), func(ctx context.Context) (proto.Message, error) {
		var err error
		raw, err = handler(ctx, req)
		m, _ := raw.(proto.Message)
		return m, err
	})
	if out.Ran && out.Terminal == nil {
		return raw, err
	}
	return answer(ctx, g, info, out, err)
}

// call is the Guard's view of a call.
func call(ctx context.Context, req any, info *grpc.UnaryServerInfo) idemrpc.Call {
	return idemrpc.Call{
		Method: info.FullMethod,
		// The entries the Guard reads, not a copy of all of them
		// (metadata.FromIncomingContext copies every entry).
		Metadata: func(name string) []string { return metadata.ValueFromIncomingContext(ctx, name) },
		Request:  req,
		StatusOf: StatusOf,
	}
}

// answer is the interceptor's answer to a call whose handler did not
// answer it itself: a stored terminal error (of this call's handler, or
// replayed), a replayed response, or a refusal.
func answer(ctx context.Context, g *idemrpc.Guard, info *grpc.UnaryServerInfo, out idemrpc.Outcome, err error) (any, error) {
	if out.Terminal != nil {
		return nil, status.FromProto(out.Terminal).Err()
	}
	if out.Replayed {
		_ = grpc.SetHeader(ctx, replayedMD)
	}
	if err != nil {
		st := g.Status(ctx, info.FullMethod, err)
		if ms, ok := retryDelayMillis(st); ok {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackMetadata, ms))
		}
		return nil, status.FromProto(st).Err()
	}
	return out.Response, nil
}

var replayedMD = metadata.Pairs(idemrpc.ReplayedMetadata, "true")

// retryDelayMillis returns the retry delay of st's RetryInfo detail in
// milliseconds, if it has one.
func retryDelayMillis(st *spb.Status) (string, bool) {
	for _, d := range st.GetDetails() {
		var ri errdetails.RetryInfo
		if d.MessageIs(&ri) && d.UnmarshalTo(&ri) == nil {
			return strconv.FormatInt(ri.GetRetryDelay().AsDuration().Milliseconds(), 10), true
		}
	}
	return "", false
}

// StreamServerInterceptor returns the interceptor that refuses the
// streaming methods named in g's Config.Methods with UNIMPLEMENTED and a
// [*idemrpc.StreamingMethodError] logged: idem covers unary methods only.
// Other streams pass through. [Check] finds such a configuration before
// any call does.
func StreamServerInterceptor(g *idemrpc.Guard) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if _, err := g.Covered(info.FullMethod, true); err != nil {
			return status.FromProto(g.Status(ss.Context(), info.FullMethod, err)).Err()
		}
		return handler(srv, ss)
	}
}

// MethodError is a method named in Config.Methods that the server does not
// serve (a typo, or a service not registered). It matches
// [idem.ErrInvalidConfig].
type MethodError struct {
	Method string
}

func (e *MethodError) Error() string {
	return fmt.Sprintf("idemgrpc: %s is in Config.Methods but the server serves no such method", e.Method)
}

// Is makes errors.Is(err, idem.ErrInvalidConfig) true.
func (e *MethodError) Is(target error) bool { return target == idem.ErrInvalidConfig }

// Check compares g's Config.Methods with the services registered on srv:
// a streaming method is a [*idemrpc.StreamingMethodError], a method srv
// does not serve a [*MethodError]; both match [idem.ErrInvalidConfig].
// Call it once the services are registered, before Serve.
func Check(g *idemrpc.Guard, srv *grpc.Server) error {
	served := map[string]grpc.MethodInfo{}
	for svc, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			served["/"+svc+"/"+m.Name] = m
		}
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(g.Config().Methods)) {
		m, ok := served[name]
		switch {
		case !ok:
			errs = append(errs, &MethodError{Method: name})
		case m.IsClientStream || m.IsServerStream:
			errs = append(errs, &idemrpc.StreamingMethodError{Method: name})
		}
	}
	return errors.Join(errs...)
}

// StatusOf returns the google.rpc.Status of an error a handler returned:
// the gRPC status inside it (code, message, details; text wrapped around
// it is dropped), CANCELLED or DEADLINE_EXCEEDED for a context error,
// UNKNOWN with the error's text for any other.
func StatusOf(err error) *spb.Status {
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) {
		if s := gs.GRPCStatus(); s != nil {
			return s.Proto()
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Proto()
	}
	return status.New(codes.Unknown, err.Error()).Proto()
}

// Replayed reports whether a response's header metadata (grpc.Header)
// says it was replayed: a stored response or a stored terminal error of an
// earlier call with the same key.
func Replayed(header metadata.MD) bool {
	v := header.Get(idemrpc.ReplayedMetadata)
	return len(v) == 1 && strings.EqualFold(v[0], "true")
}
