// Codecs: how a result is encoded for the store and decoded on a replay
// (JSONCodec).

package idem

import (
	"bytes"
	"encoding/json"
)

// Codec encodes operation results for storage and decodes them on replay.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the default [Codec], encoding/json, except for results that
// are bytes already: a []byte or json.RawMessage result (or a pointer to
// one) is stored as it is, not as JSON — encoding/json would make a
// []byte a base64 string a third larger, and re-encode raw JSON — and
// decoded back into a *[]byte or *json.RawMessage as a copy of the stored
// bytes. Bytes inside another type (a struct field) are JSON as usual.
//
// With JSONCodec the engine keeps a copy of such a result,
// not the operation's slice: an operation may reuse its buffer (a pooled
// one) once its call has returned.
type JSONCodec struct{}

// Marshal returns the bytes of a []byte or json.RawMessage (or a pointer to
// either), else json.Marshal(v).
func (JSONCodec) Marshal(v any) ([]byte, error) {
	if b, ok := rawOf(v); ok {
		return b, nil
	}
	return json.Marshal(v)
}

// Unmarshal sets a *[]byte or *json.RawMessage to a copy of data, else
// returns json.Unmarshal(data, v).
func (JSONCodec) Unmarshal(data []byte, v any) error {
	if setRaw(data, v) {
		return nil
	}
	return json.Unmarshal(data, v)
}

// rawOf returns the bytes of a []byte or json.RawMessage or a pointer to
// either.
func rawOf(v any) ([]byte, bool) {
	switch b := v.(type) {
	case []byte:
		return b, true
	case json.RawMessage:
		return b, true
	case *[]byte:
		return *b, true
	case *json.RawMessage:
		return *b, true
	}
	return nil, false
}

// setRaw sets a *[]byte or *json.RawMessage to a copy of data.
func setRaw(data []byte, v any) bool {
	switch p := v.(type) {
	case *[]byte:
		*p = bytes.Clone(data)
		return true
	case *json.RawMessage:
		*p = bytes.Clone(data)
		return true
	}
	return false
}

// rawBytes returns the bytes of *p when T is []byte or json.RawMessage.
func rawBytes[T any](p *T) ([]byte, bool) {
	switch b := any(p).(type) {
	case *[]byte:
		return *b, true
	case *json.RawMessage:
		return *b, true
	}
	return nil, false
}

// setRawBytes sets *p to a copy of data when T is []byte or
// json.RawMessage, and reports whether it did.
func setRawBytes[T any](p *T, data []byte) bool {
	switch b := any(p).(type) {
	case *[]byte:
		*b = bytes.Clone(data)
		return true
	case *json.RawMessage:
		*b = bytes.Clone(data)
		return true
	}
	return false
}
