package idem

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Codec encodes operation results for storage and decodes them on replay.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the default [Codec], encoding/json.
type JSONCodec struct{}

// Marshal returns json.Marshal(v).
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal returns json.Unmarshal(data, v).
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// RawCodec stores results as they are, for operations whose result is
// already bytes: []byte, or json.RawMessage for raw JSON. An engine with
// RawCodec encodes and decodes such results without reflection (a replay
// copies the stored bytes once); any other type fails to encode with an
// error naming it, which the engine records as for any result that cannot
// be encoded.
type RawCodec struct{}

// Marshal returns the bytes of a []byte, json.RawMessage or a pointer to
// either.
func (RawCodec) Marshal(v any) ([]byte, error) {
	switch b := v.(type) {
	case []byte:
		return b, nil
	case json.RawMessage:
		return b, nil
	case *[]byte:
		return *b, nil
	case *json.RawMessage:
		return *b, nil
	}
	return nil, fmt.Errorf("idem: RawCodec encodes []byte and json.RawMessage results, not %T", v)
}

// Unmarshal sets a *[]byte or *json.RawMessage to a copy of data.
func (RawCodec) Unmarshal(data []byte, v any) error {
	switch p := v.(type) {
	case *[]byte:
		*p = bytes.Clone(data)
		return nil
	case *json.RawMessage:
		*p = bytes.Clone(data)
		return nil
	}
	return fmt.Errorf("idem: RawCodec decodes into *[]byte or *json.RawMessage, not %T", v)
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
