package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/seed-a1b882c0/idem"
)

// plainJSON is encoding/json alone: the default codec before []byte and
// json.RawMessage results were stored raw.
type plainJSON struct{}

func (plainJSON) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (plainJSON) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

func storedResult(t *testing.T, en *env, r idem.Request) []byte {
	t.Helper()
	k, err := idem.NewStoreKey(r.Operation, "", []byte(r.Key))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := en.mem.Get(context.Background(), k.String())
	if err != nil {
		t.Fatal(err)
	}
	return rec.Result
}

// TestBytesResultsAreStoredRaw: under the default codec a []byte result is
// stored as its bytes (base64 JSON would be a third larger) and a
// json.RawMessage result as given (not re-encoded); both replay as they
// were returned, from the store and from the local cache, and through
// State.Decode.
func TestBytesResultsAreStoredRaw(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	blob := make([]byte, 3000)
	for i := range blob {
		blob[i] = byte(rand.IntN(256))
	}
	raw := json.RawMessage(`{ "id": "tr_1",  "amount": 100 }`) // spaces kept: not re-encoded
	for _, cache := range []bool{false, true} {
		cfg := idem.Config{}
		if cache {
			cfg.CacheEntries = 10
		}
		en := setup(t, cfg)
		r1 := idem.Request{Operation: "blob", Key: "b"}
		res, err := idem.Do(ctx, en.eng, r1, func(context.Context) ([]byte, error) { return blob, nil })
		if err != nil || !bytes.Equal(res.Value, blob) {
			t.Fatal(err)
		}
		if got := storedResult(t, en, r1); len(got) != len(blob) || !bytes.Equal(got, blob) {
			t.Fatalf("cache %v: a %d-byte result stored as %d bytes", cache, len(blob), len(got))
		}
		r2 := idem.Request{Operation: "raw", Key: "r"}
		if _, err := idem.Do(ctx, en.eng, r2, func(context.Context) (json.RawMessage, error) { return raw, nil }); err != nil {
			t.Fatal(err)
		}
		if got := storedResult(t, en, r2); !bytes.Equal(got, raw) {
			t.Fatalf("cache %v: raw JSON stored as %s", cache, got)
		}
		for _, e := range []*idem.Engine{en.eng, en.another(t, idem.Config{})} { // the second one has no cache
			again, err := idem.Do(ctx, e, r1, func(context.Context) ([]byte, error) { t.Fatal("ran again"); return nil, nil })
			if err != nil || !again.Replayed || !bytes.Equal(again.Value, blob) {
				t.Fatalf("cache %v: []byte replay: %v, %v", cache, again.Replayed, err)
			}
			rr, err := idem.Do(ctx, e, r2, func(context.Context) (json.RawMessage, error) { t.Fatal("ran again"); return nil, nil })
			if err != nil || !rr.Replayed || !bytes.Equal(rr.Value, raw) {
				t.Fatalf("cache %v: json.RawMessage replay: %s, %v", cache, rr.Value, err)
			}
		}
		k, _ := idem.NewStoreKey("blob", "", []byte("b"))
		st, err := en.eng.Status(ctx, k)
		var b []byte
		if err != nil || st.Decode(&b) != nil || !bytes.Equal(b, blob) {
			t.Fatalf("State.Decode: %v", err)
		}
	}
}

// TestBytesResultIsCopied: with JSONCodec the engine keeps a
// copy of a []byte result, not the operation's slice, so an operation may
// reuse its buffer once the call has returned (idemrpc encodes responses
// into pooled buffers): a replay, from the store or the local cache, gets
// the bytes as they were returned.
func TestBytesResultIsCopied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, cfg := range []idem.Config{{}, {Codec: idem.JSONCodec{}}, {CacheEntries: 10}} {
		en := setup(t, cfg)
		buf := []byte("response-1")
		r := idem.Request{Operation: "reuse", Key: "k"}
		if _, err := idem.Do(ctx, en.eng, r, func(context.Context) ([]byte, error) { return buf, nil }); err != nil {
			t.Fatal(err)
		}
		copy(buf, "XXXXXXXXXX") // the buffer reused by the next call
		res, err := idem.Do(ctx, en.eng, r, func(context.Context) ([]byte, error) { t.Fatal("ran again"); return nil, nil })
		if err != nil || !res.Replayed || string(res.Value) != "response-1" {
			t.Fatalf("codec %T, cache %v: replay %q, %v", cfg.Codec, cfg.CacheEntries > 0, res.Value, err)
		}
		if got := storedResult(t, en, r); string(got) != "response-1" {
			t.Fatalf("codec %T: stored %q", cfg.Codec, got)
		}
	}
}

// TestJSONCodecBytes pins the codec itself: []byte and json.RawMessage
// (and pointers to them) as they are, everything else, bytes in a struct
// included, as encoding/json.
func TestJSONCodecBytes(t *testing.T) {
	t.Parallel()
	c := idem.JSONCodec{}
	b := []byte{0, 1, 2, 255}
	for _, v := range []any{b, &b, json.RawMessage(b), (*json.RawMessage)(&b)} {
		if got, err := c.Marshal(v); err != nil || !bytes.Equal(got, b) {
			t.Errorf("Marshal(%T) = %q, %v", v, got, err)
		}
	}
	if got, _ := c.Marshal(struct{ B []byte }{b}); string(got) != `{"B":"AAEC/w=="}` {
		t.Errorf("bytes in a struct: %s", got)
	}
	var out []byte
	var rm json.RawMessage
	if c.Unmarshal(b, &out) != nil || c.Unmarshal(b, &rm) != nil || !bytes.Equal(out, b) || !bytes.Equal(rm, b) {
		t.Errorf("Unmarshal: %v %v", out, rm)
	}
	b[0] = 9
	if out[0] != 0 || rm[0] != 0 {
		t.Error("Unmarshal kept the caller's slice, not a copy")
	}
}

// TestRecordsOfTheEarlierEncoding: a json.RawMessage result stored as JSON
// by the earlier default replays the same, since its JSON is its bytes. A
// []byte result it stored (a base64 JSON string) replays as that string's
// JSON text, not the bytes: no release wrote such records, so there is no
// compatibility path — delete them, or let them expire.
func TestRecordsOfTheEarlierEncoding(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	en := setup(t, idem.Config{Codec: plainJSON{}})
	raw := json.RawMessage(`{"id":"tr_1"}`)
	if _, err := idem.Do(ctx, en.eng, req("raw"), func(context.Context) (json.RawMessage, error) { return raw, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Do(ctx, en.eng, req("bytes"), func(context.Context) ([]byte, error) { return []byte("hi"), nil }); err != nil {
		t.Fatal(err)
	}
	now := en.another(t, idem.Config{})
	rr, err := idem.Do(ctx, now, req("raw"), func(context.Context) (json.RawMessage, error) { return nil, nil })
	if err != nil || !rr.Replayed || !bytes.Equal(rr.Value, raw) {
		t.Fatalf("json.RawMessage stored as JSON: %s, %v", rr.Value, err)
	}
	rb, err := idem.Do(ctx, now, req("bytes"), func(context.Context) ([]byte, error) { return nil, nil })
	if err != nil || !rb.Replayed || string(rb.Value) != `"aGk="` {
		t.Fatalf("[]byte stored as base64 JSON: %q, %v", rb.Value, err)
	}
}
