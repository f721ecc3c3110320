package idem

import "encoding/json"

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
