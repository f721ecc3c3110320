package idemrpc

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
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
