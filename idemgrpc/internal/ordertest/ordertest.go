// Package ordertest is the service the module's tests, examples and
// benchmarks call over real gRPC and Connect servers: idem.test.v1.Orders,
// whose descriptors are built here in Go (no code generator), with
// google.protobuf.Struct requests and responses.
//
//	service Orders {
//	  rpc Create(google.protobuf.Struct) returns (google.protobuf.Struct);
//	  rpc Get(google.protobuf.Struct) returns (google.protobuf.Struct) {
//	    option idempotency_level = NO_SIDE_EFFECTS;
//	  }
//	  rpc Watch(google.protobuf.Struct) returns (stream google.protobuf.Struct);
//	}
//
// Test-only.
package ordertest

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The service and its methods' full names.
const (
	Service = "idem.test.v1.Orders"
	Create  = "/idem.test.v1.Orders/Create"
	Get     = "/idem.test.v1.Orders/Get"
	Watch   = "/idem.test.v1.Orders/Watch"
)

// Files holds the service's file, idem/test/v1/orders.proto (its import,
// google/protobuf/struct.proto, is in protoregistry.GlobalFiles).
var Files = func() *protoregistry.Files {
	st := "." + string((&structpb.Struct{}).ProtoReflect().Descriptor().FullName())
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("idem/test/v1/orders.proto"),
		Package:    proto.String("idem.test.v1"),
		Dependency: []string{"google/protobuf/struct.proto"},
		Syntax:     proto.String("proto3"),
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Orders"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String("Create"), InputType: proto.String(st), OutputType: proto.String(st)},
				{Name: proto.String("Get"), InputType: proto.String(st), OutputType: proto.String(st),
					Options: &descriptorpb.MethodOptions{IdempotencyLevel: descriptorpb.MethodOptions_NO_SIDE_EFFECTS.Enum()}},
				{Name: proto.String("Watch"), InputType: proto.String(st), OutputType: proto.String(st), ServerStreaming: proto.Bool(true)},
			},
		}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	var files protoregistry.Files
	if err := files.RegisterFile(fd); err != nil {
		panic(err)
	}
	return &files
}()

// Method returns the descriptor of a method of the service by its short
// name ("Create").
func Method(name string) protoreflect.MethodDescriptor {
	d, err := Files.FindDescriptorByName(Service)
	if err != nil {
		panic(err)
	}
	return d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name))
}

// Server implements the service with funcs a test sets; Calls counts the
// executions of each method. A nil func answers with its request.
type Server struct {
	CreateFunc, GetFunc func(context.Context, *structpb.Struct) (*structpb.Struct, error)
	// Creates and Gets count the executions.
	Creates, Gets atomic.Int64
}

// Create runs CreateFunc.
func (s *Server) Create(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	s.Creates.Add(1)
	if s.CreateFunc == nil {
		return in, nil
	}
	return s.CreateFunc(ctx, in)
}

// GetOrder runs GetFunc.
func (s *Server) GetOrder(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
	s.Gets.Add(1)
	if s.GetFunc == nil {
		return in, nil
	}
	return s.GetFunc(ctx, in)
}

// ServiceDesc is the gRPC service description, written by hand as
// protoc-gen-go-grpc would generate it.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: Service,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Create", Handler: unary(Create, (*Server).Create)},
		{MethodName: "Get", Handler: unary(Get, (*Server).GetOrder)},
	},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			in := new(structpb.Struct)
			if err := stream.RecvMsg(in); err != nil {
				return err
			}
			return stream.SendMsg(in)
		},
	}},
	Metadata: "idem/test/v1/orders.proto",
}

func unary(full string, m func(*Server, context.Context, *structpb.Struct) (*structpb.Struct, error)) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		if icpt == nil {
			return m(srv.(*Server), ctx, in)
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: full}
		return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) {
			return m(srv.(*Server), ctx, req.(*structpb.Struct))
		})
	}
}

// Call makes a unary call of method on cc.
func Call(ctx context.Context, cc grpc.ClientConnInterface, method string, in *structpb.Struct, opts ...grpc.CallOption) (*structpb.Struct, error) {
	out := new(structpb.Struct)
	if err := cc.Invoke(ctx, method, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// ConnectHandler returns an http.Handler serving the service's unary
// methods and Watch over Connect, with the options (interceptors) given.
func ConnectHandler(s *Server, opts ...connect.HandlerOption) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(Create, connect.NewUnaryHandler(Create, connectUnary(s.Create), append([]connect.HandlerOption{connect.WithSchema(Method("Create"))}, opts...)...))
	mux.Handle(Get, connect.NewUnaryHandler(Get, connectUnary(s.GetOrder), append([]connect.HandlerOption{connect.WithSchema(Method("Get"))}, opts...)...))
	mux.Handle(Watch, connect.NewServerStreamHandler(Watch, func(ctx context.Context, req *connect.Request[structpb.Struct], st *connect.ServerStream[structpb.Struct]) error {
		return st.Send(req.Msg)
	}, append([]connect.HandlerOption{connect.WithSchema(Method("Watch"))}, opts...)...))
	return mux
}

func connectUnary(m func(context.Context, *structpb.Struct) (*structpb.Struct, error)) func(context.Context, *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	return func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		out, err := m(ctx, req.Msg)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(out), nil
	}
}

// Order returns a request for an order: {"order": id, "amount": amount}.
func Order(id string, amount float64) *structpb.Struct {
	s, err := structpb.NewStruct(map[string]any{"order": id, "amount": amount})
	if err != nil {
		panic(fmt.Sprint("ordertest: ", err))
	}
	return s
}
