package idemlambda

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"

	jmespath "github.com/jmespath-community/go-jmespath/pkg/api"
	"github.com/jmespath-community/go-jmespath/pkg/functions"
)

// ExprError says that a JMESPath expression does not compile, or failed on
// an event.
type ExprError struct {
	// Field names the setting: "KeyJMESPath" or "ValidationJMESPath".
	Field, Expr string
	Err         error
}

func (e *ExprError) Error() string {
	return fmt.Sprintf("idemlambda: %s %q: %v", e.Field, e.Expr, e.Err)
}

// Unwrap returns the JMESPath error.
func (e *ExprError) Unwrap() error { return e.Err }

// The functions Powertools adds to JMESPath, with the same names, so that
// its expressions work unchanged: powertools_json parses a JSON string (an
// API Gateway or SQS body), powertools_base64 decodes base64,
// powertools_base64_gzip decodes base64 then gunzips.
var powertoolsFunctions = []functions.FunctionEntry{
	{
		Name:      "powertools_json",
		Arguments: []functions.ArgSpec{{Types: []functions.JpType{functions.JpString}}},
		Handler: func(args []any) (any, error) {
			var v any
			if err := json.Unmarshal([]byte(args[0].(string)), &v); err != nil {
				return nil, fmt.Errorf("powertools_json: %w", err)
			}
			return v, nil
		},
	},
	{
		Name:      "powertools_base64",
		Arguments: []functions.ArgSpec{{Types: []functions.JpType{functions.JpString}}},
		Handler: func(args []any) (any, error) {
			b, err := base64.StdEncoding.DecodeString(args[0].(string))
			if err != nil {
				return nil, fmt.Errorf("powertools_base64: %w", err)
			}
			return string(b), nil
		},
	},
	{
		Name:      "powertools_base64_gzip",
		Arguments: []functions.ArgSpec{{Types: []functions.JpType{functions.JpString}}},
		Handler: func(args []any) (any, error) {
			b, err := base64.StdEncoding.DecodeString(args[0].(string))
			if err != nil {
				return nil, fmt.Errorf("powertools_base64_gzip: %w", err)
			}
			zr, err := gzip.NewReader(bytes.NewReader(b))
			if err != nil {
				return nil, fmt.Errorf("powertools_base64_gzip: %w", err)
			}
			out, err := io.ReadAll(io.LimitReader(zr, 16<<20))
			if err != nil {
				return nil, fmt.Errorf("powertools_base64_gzip: %w", err)
			}
			return string(out), nil
		},
	},
}

// expr is a compiled JMESPath expression (nil: none configured).
type expr struct {
	field, src string
	jp         jmespath.JMESPath
}

func compile(field, src string) (*expr, error) {
	if src == "" {
		return nil, nil
	}
	jp, err := jmespath.Compile(src, powertoolsFunctions...)
	if err != nil {
		return nil, &ExprError{Field: field, Expr: src, Err: err}
	}
	return &expr{field: field, src: src, jp: jp}, nil
}

// search evaluates e over a decoded JSON event.
func (e *expr) search(event any) (any, error) {
	v, err := e.jp.Search(event)
	if err != nil {
		return nil, &ExprError{Field: e.field, Expr: e.src, Err: err}
	}
	return v, nil
}

// missing reports whether a selected value counts as no key, as Powertools
// decides: null, an empty or false scalar, or a list or object whose values
// are all null.
func missing(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case float64:
		return x == 0
	case []any:
		for _, e := range x {
			if e != nil {
				return false
			}
		}
		return true
	case map[string]any:
		for _, e := range x {
			if e != nil {
				return false
			}
		}
		return true
	}
	return false
}

// decode parses a raw event for JMESPath. Numbers become float64, as
// JMESPath functions expect: a numeric key above 2^53 loses precision, so
// select such ids as strings.
func decode(raw []byte) (any, error) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("idemlambda: event is not JSON: %w", err)
	}
	return v, nil
}
