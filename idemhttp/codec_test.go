package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/idemhttp"
)

var _ idem.Codec = idemhttp.ResponseCodec{}

// codecResponses are responses whose JSON ResponseCodec must write exactly
// as encoding/json does.
var codecResponses = []idemhttp.Response{
	{},
	{Status: 201},
	{Status: -7, Body: []byte{0}},
	{Status: 200, Body: []byte(`{"id":"ord_1","status":"created"}`)},
	{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Charge-Id": {"ch_1", "ch_2"}}, Body: []byte("ok")},
	{Status: 200, Header: http.Header{}},
	{Status: 200, Header: http.Header{"Empty": {}, "Nil": nil, "Blank": {""}}},
	{Status: 302, Header: http.Header{"Location": {"/a?b=1&c=<2>"}, "X-Quote": {`say "hi" \ bye`}}},
	{Status: 200, Header: http.Header{"X-Unicode": {"caf\u00e9 \u2028 \x7f \x01 \xff"}, "lower-case": {"v"}}},
	{Status: 999999999999, Body: make([]byte, 1000)},
}

func TestResponseCodecWritesWhatJSONWrites(t *testing.T) {
	t.Parallel()
	var c idemhttp.ResponseCodec
	for _, r := range codecResponses {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []any{r, &r} {
			got, err := c.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("Marshal(%T %+v)\n got %s\nwant %s", v, r, got, want)
			}
		}
		var back idemhttp.Response
		if err := c.Unmarshal(want, &back); err != nil {
			t.Fatalf("Unmarshal(%s): %v", want, err)
		}
		var jsonBack idemhttp.Response
		_ = json.Unmarshal(want, &jsonBack)
		if !reflect.DeepEqual(back, jsonBack) {
			t.Errorf("Unmarshal(%s)\n got %#v\nwant %#v", want, back, jsonBack)
		}
	}
	// Other values are encoding/json's.
	got, err := c.Marshal(map[string]int{"b": 2, "a": 1})
	if err != nil || string(got) != `{"a":1,"b":2}` {
		t.Errorf("Marshal(map) = %s, %v", got, err)
	}
	var m map[string]int
	if err := c.Unmarshal(got, &m); err != nil || m["b"] != 2 {
		t.Errorf("Unmarshal(map) = %v, %v", m, err)
	}
	var nilResp *idemhttp.Response
	if got, err := c.Marshal(nilResp); err != nil || string(got) != "null" {
		t.Errorf("Marshal(nil *Response) = %s, %v", got, err)
	}
}

// codecInputs are stored JSON documents the fast path must decode as
// encoding/json does, or leave to it.
var codecInputs = []string{
	`{"status":201,"header":{"Content-Type":["application/json"]},"body":"b2s="}`,
	`{"status":201}`,
	`{"status":201,"header":{}}`,
	`{"status":201,"header":{"A":[]}}`,
	`{"status":201,"header":{"A":null}}`,
	`{"status":201,"header":null}`,
	`{"status":201,"header":{"A":["1"],"A":["2"]}}`,
	`{"status":201,"body":""}`,
	`{"status":201,"body":null}`,
	`{"status":201,"body":"!!"}`,
	`{"status":201,"body":"b2s"}`,
	`{"status":201,"body":"b2\ns="}`,
	`{"status": 201}`,
	`{"Status":201}`,
	`{"status":201,"extra":1}`,
	`{"header":{"A":["1"]},"status":201}`,
	`{"status":201}x`,
	`{"status":201} `,
	`{"status":0201}`,
	`{"status":-0}`,
	`{"status":2.5}`,
	`{"status":1e3}`,
	`{"status":99999999999999999999}`,
	`{"status":201,"header":{"A":["\u003c"]}}`,
	`{"status":201,"header":{"A":["caf` + "\u00e9" + `"]}}`,
	`{"status":201,"header":{"A":["1",]}}`,
	`{"status":201,"header":{"A":["1"],}}`,
	`{"status":201,"header":{"A":"1"}}`,
	`{"status":201`,
	`null`,
	``,
}

func TestResponseCodecReadsWhatJSONReads(t *testing.T) {
	t.Parallel()
	for _, in := range codecInputs {
		checkDecode(t, []byte(in))
	}
}

func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	var got, want idemhttp.Response
	gerr := idemhttp.ResponseCodec{}.Unmarshal(data, &got)
	werr := json.Unmarshal(data, &want)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("Unmarshal(%q): error %v, encoding/json's %v", data, gerr, werr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("Unmarshal(%q)\n got %#v\nwant %#v", data, got, want)
	}
}

func FuzzResponseCodec(f *testing.F) {
	for _, in := range codecInputs {
		f.Add([]byte(in))
	}
	for _, r := range codecResponses {
		b, _ := json.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
		var r idemhttp.Response
		if json.Unmarshal(data, &r) != nil {
			return
		}
		want, err := json.Marshal(r)
		if err != nil {
			return
		}
		got, _ := idemhttp.ResponseCodec{}.Marshal(r)
		if string(got) != string(want) {
			t.Fatalf("Marshal(%#v)\n got %s\nwant %s", r, got, want)
		}
	})
}

// BenchmarkCodec encodes and decodes the response the gateway benchmark
// stores, with encoding/json and with ResponseCodec.
func BenchmarkCodec(b *testing.B) {
	r := idemhttp.Response{Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"ord_1","status":"created"}`)}
	data, _ := json.Marshal(r)
	for _, c := range []struct {
		name  string
		codec idem.Codec
	}{{"json", idem.JSONCodec{}}, {"response-codec", idemhttp.ResponseCodec{}}} {
		b.Run(c.name+"/marshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.codec.Marshal(r); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/unmarshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var out idemhttp.Response
				if err := c.codec.Unmarshal(data, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// ParseStored finds the responses the middleware stores, with either
// codec, and nothing else: an application's JSON result is not a response.
func TestParseStored(t *testing.T) {
	t.Parallel()
	stored := idemhttp.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":7}`)}
	for name, codec := range map[string]idem.Codec{"ResponseCodec": idemhttp.ResponseCodec{}, "JSONCodec": idem.JSONCodec{}} {
		b, err := codec.Marshal(stored)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := idemhttp.ParseStored(b)
		if !ok || !reflect.DeepEqual(got, stored) {
			t.Errorf("%s: ParseStored(%s) = %+v, %v", name, b, got, ok)
		}
	}
	if got, ok := idemhttp.ParseStored([]byte(`{"status":204}`)); !ok || got.Status != 204 || got.Body != nil {
		t.Errorf("no header, no body: %+v, %v", got, ok)
	}
	for _, b := range []string{
		``, `null`, `"ok"`, `[1]`, `{"id":7}`, `not json`,
		`{"status":"paid"}`,              // an application's own status
		`{"status":200,"id":7}`,          // a field a response has not
		`{"status":0}`, `{"status":600}`, // no HTTP status
		`{"body":"e30="}`,               // no status
		`{"status":200,"body":"%%%"}`,   // a body that is not base64
		`{"status":200} {"status":200}`, // two values
	} {
		if got, ok := idemhttp.ParseStored([]byte(b)); ok {
			t.Errorf("ParseStored(%q) = %+v, true; want false", b, got)
		}
	}
}
