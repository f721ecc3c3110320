package idemrpc

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The stored response is byte for byte what proto.Marshal of its Any gives
// (so records written before and after read alike), and readAny reads back
// what it wrote, as proto.Unmarshal of an Any does. Appended to a used
// buffer (a pooled one), the bytes before it stay as they were.
func TestEncodeResponseIsTheAnyEncoding(t *testing.T) {
	big, _ := structpb.NewStruct(map[string]any{"order": "o-1", "amount": 25.0, "lines": []any{"a", "b"}, "z": map[string]any{"y": true}})
	for _, m := range []proto.Message{big, &emptypb.Empty{}, wrapperspb.String(string(make([]byte, 300)))} {
		prefix := []byte("earlier")
		out, err := appendResponse(append(make([]byte, 0, 8), prefix...), m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(out, prefix) {
			t.Fatalf("%T: the buffer's bytes were overwritten: %q", m, out)
		}
		got := out[len(prefix):]
		v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		a := &anypb.Any{TypeUrl: "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName()), Value: v}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%T: encoded %x, want %x", m, got, want)
		}
		url, value, err := readAny(got)
		if err != nil || string(url) != a.GetTypeUrl() || !bytes.Equal(value, a.GetValue()) {
			t.Errorf("%T: read back %q %x, %v; want %q %x", m, url, value, err, a.GetTypeUrl(), a.GetValue())
		}
	}
	if _, _, err := readAny([]byte{0x0a, 0x05, 'a'}); err == nil {
		t.Error("a truncated Any read without an error")
	}
}

// decodeResponse gives back the stored message, and a *ResponseError
// naming the type URL when the type is unknown or the value damaged.
func TestDecodeResponse(t *testing.T) {
	g := &Guard{cfg: Config{Types: protoregistry.GlobalTypes}}
	in := wrapperspb.String("receipt")
	b, err := appendResponse(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := g.decodeResponse("k", b)
	if err != nil || !proto.Equal(out, in) {
		t.Fatalf("decoded %v, %v; want %v", out, err, in)
	}
	url := "type.googleapis.com/google.protobuf.StringValue"
	var re *ResponseError
	unknown := &Guard{cfg: Config{Types: new(protoregistry.Types)}}
	if _, err := unknown.decodeResponse("k", b); !errors.As(err, &re) || re.Type != url || re.Key != "k" {
		t.Errorf("unknown type: %v", err)
	}
	damaged := append(bytes.Clone(b[:len(b)-1]), 0xff)
	if _, err := g.decodeResponse("k", damaged); !errors.As(err, &re) || re.Type != url {
		t.Errorf("damaged value: %v", err)
	}
}
