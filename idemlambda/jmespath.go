package idemlambda

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	jmespath "github.com/jmespath-community/go-jmespath/pkg/api"
	"github.com/jmespath-community/go-jmespath/pkg/functions"

	"github.com/seed-a1b882c0/idem/canonical"
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
			v, err := decodeJSON([]byte(args[0].(string)))
			if err != nil {
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

// decode parses a raw event for JMESPath (see [decodeJSON]).
func decode(raw []byte) (any, error) {
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("idemlambda: event is not JSON: %w", err)
	}
	return v, nil
}

// decodeJSON parses a JSON document with its numbers read exactly: a
// number becomes a float64 when the float64's shortest decimal form is the
// same number, as [canonical.JSON] reads both (1, 1.0, 0.1, 2e10), so
// that JMESPath's comparisons, arithmetic and functions work on it as before;
// any other number (9007199254740993, 0.10000000000000001, 1E700) stays a
// json.Number holding its text, so that a key selected from it is the
// canonical form of what was sent, never a rounded neighbour or an error.
// JMESPath sees such a json.Number as no number: comparing it gives null,
// and functions that take numbers reject it.
func decodeJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON value")
	}
	return exactNumbers(v), nil
}

// exactNumbers replaces, in place, every json.Number in v that a float64
// holds exactly by that float64.
func exactNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if f, ok := exactFloat(x); ok {
			return f
		}
	case []any:
		for i, e := range x {
			x[i] = exactNumbers(e)
		}
	case map[string]any:
		for k, e := range x {
			x[k] = exactNumbers(e)
		}
	}
	return v
}

// exactFloat returns n as a float64 when that loses nothing: the float64's
// shortest decimal form and n have the same canonical form.
func exactFloat(n json.Number) (float64, bool) {
	s := string(n)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil { // out of range
		return 0, false
	}
	// Fast path: an integer of up to 15 digits is exact in a float64.
	if len(s) <= 15 && !strings.ContainsAny(s, ".eE") {
		return f, true
	}
	want, err := canonical.JSON([]byte(s))
	if err != nil { // an exponent Canonicalize refuses
		return 0, false
	}
	got, err := canonical.JSON(strconv.AppendFloat(nil, f, 'g', -1, 64))
	if err != nil || !bytes.Equal(got, want) {
		return 0, false
	}
	return f, true
}
