package idemhttp

import (
	"net/http"
	"slices"
	"strings"
)

// NeverReplayed are the response headers that are never stored or
// replayed, whatever Config.ReplayHeaders says: cookies, credentials and
// authentication exchanges (they belong to one response, not to its
// replays), hop-by-hop headers, and the headers the server computes for
// each response.
var NeverReplayed = []string{
	"Set-Cookie", "Authorization", "Proxy-Authorization",
	"Www-Authenticate", "Proxy-Authenticate", "Authentication-Info", "Proxy-Authentication-Info",
	"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Content-Length", "Date", ReplayedHeader,
}

// replayPolicy decides which response headers are stored and replayed.
type replayPolicy struct {
	never map[string]bool // NeverReplayed, canonical
	only  map[string]bool // Config.ReplayHeaders, canonical; nil: all but never
}

// newReplayPolicy returns the policy for Config.ReplayHeaders, and the
// first header it lists that is never replayed, if any.
func newReplayPolicy(only []string) (*replayPolicy, string) {
	p := &replayPolicy{never: make(map[string]bool, len(NeverReplayed))}
	for _, name := range NeverReplayed {
		p.never[http.CanonicalHeaderKey(name)] = true
	}
	if len(only) > 0 {
		p.only = make(map[string]bool, len(only))
	}
	for _, name := range only {
		ch := http.CanonicalHeaderKey(name)
		if p.never[ch] {
			return nil, ch
		}
		p.only[ch] = true
	}
	return p, ""
}

// filter returns a copy of the headers of h that are stored and replayed,
// or nil when there are none. A name is checked in its canonical form, so
// that a handler writing h["set-cookie"] directly is no way around the
// list; trailers, and the headers the Connection header names (hop-by-hop
// by RFC 9110), are left out too.
func (p *replayPolicy) filter(h http.Header) http.Header {
	var out http.Header
	for name, vs := range h {
		ch := http.CanonicalHeaderKey(name)
		switch {
		case len(vs) == 0, p.never[ch], strings.HasPrefix(name, http.TrailerPrefix),
			p.only != nil && !p.only[ch], connectionListed(h, ch):
			continue
		}
		if out == nil {
			out = make(http.Header, len(h))
		}
		out[ch] = append(out[ch], vs...)
	}
	return out
}

// connectionListed reports whether the Connection header of h names name.
func connectionListed(h http.Header, name string) bool {
	for _, v := range h["Connection"] {
		if slices.ContainsFunc(strings.Split(v, ","), func(s string) bool {
			return strings.EqualFold(strings.TrimSpace(s), name)
		}) {
			return true
		}
	}
	return false
}
