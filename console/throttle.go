package console

import (
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// throttle slows failed sign-ins down. Two counts close sign-in: a
// client's failures whatever users they name, and a client's failures as
// one user. The first Config.SignInFailures failures within
// Config.SignInWindow pass, each further one closes sign-in to that
// client (for all users, or for that user) for a delay that doubles with
// every failure (starting at the window divided by the failures allowed,
// at most Config.SignInMaxDelay). While closed, a sign-in is answered 429
// with Retry-After before its credentials are checked, so a guesser
// learns nothing from it. The third count, a user's failures from every
// client together, never closes anything: past the same limit it holds
// each sign-in as that user for Config.SignInUserDelay before its
// credentials are checked, so that a guesser spread over many clients is
// slowed, and one that hammers from a single client cannot shut the
// operator out (OWASP: lock out the source, not the account). A burst
// (failures with no pause of a window between them) is logged as a few
// summary lines, not one line per failure.
type throttle struct {
	limit     int
	window    time.Duration
	maxDelay  time.Duration
	userDelay time.Duration
	mu        sync.Mutex
	m         map[string]*burst
	maxBursts int
}

// signInKeys are the throttle's counts of one sign-in: the two that close
// sign-in to its client, and the one that slows its user's.
type signInKeys struct {
	client, clientUser, user string
}

func keysOf(client netip.Addr, user string) signInKeys {
	c := "client " + client.String()
	return signInKeys{client: c, clientUser: c + " user " + user, user: "user " + user}
}

// closing are the keys whose failures close sign-in.
func (k signInKeys) closing() []string { return []string{k.client, k.clientUser} }

// burst is the failures of one key with no pause of a window between
// them.
type burst struct {
	first, last time.Time
	failures    int
	refused     int       // attempts answered 429
	until       time.Time // sign-in is closed until then
}

// ended reports whether the burst is over at now: a whole window has
// passed without a failure since its last failure and since sign-in
// opened again, so a client that tries again as soon as it may keeps
// its growing delay.
func (b *burst) ended(now time.Time, window time.Duration) bool {
	quietSince := b.last
	if b.until.After(quietSince) {
		quietSince = b.until
	}
	return now.Sub(quietSince) >= window
}

func newThrottle(cfg *Config) *throttle {
	return &throttle{limit: cfg.SignInFailures, window: cfg.SignInWindow, maxDelay: cfg.SignInMaxDelay,
		userDelay: cfg.SignInUserDelay, m: make(map[string]*burst), maxBursts: 10_000}
}

// wait returns how long sign-in stays closed for any of keys at now (0:
// open), counting the refusal.
func (t *throttle) wait(now time.Time, keys ...string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var d time.Duration
	for _, k := range keys {
		if b := t.m[k]; b != nil && now.Before(b.until) {
			b.refused++
			d = max(d, b.until.Sub(now))
		}
	}
	return d
}

// hold returns how long a sign-in counted under the slowing key user is
// held at now before its credentials are checked: SignInUserDelay while
// the user's burst is past the limit, else 0. It never grows past that.
func (t *throttle) hold(now time.Time, user string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b := t.m[user]; b != nil && !b.ended(now, t.window) && b.failures > t.limit {
		return t.userDelay
	}
	return 0
}

// fail counts a failed sign-in under each key of k at now and returns,
// for each, what to log: nothing (""), "first" for the first failure of
// a burst, "throttled" when it closes sign-in to the client (then with
// the burst and the delay), "slowed" when the user's sign-ins begin to
// be held.
func (t *throttle) fail(now time.Time, k signInKeys) []failure {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []failure
	for _, key := range []string{k.client, k.clientUser, k.user} {
		b := t.m[key]
		if b != nil && b.ended(now, t.window) {
			b = nil
		}
		if b == nil {
			t.prune(now)
			b = &burst{first: now}
			t.m[key] = b
		}
		b.failures++
		b.last = now
		f := failure{key: key, burst: *b}
		switch over := b.failures - t.limit; {
		case b.failures == 1:
			f.kind = "first"
		case key == k.user:
			if over == 1 {
				f.kind, f.delay = "slowed", t.userDelay
			}
		case over > 0:
			delay := t.window / time.Duration(max(t.limit, 1))
			for i := 1; i < over && delay < t.maxDelay; i++ {
				delay *= 2
			}
			b.until = now.Add(min(delay, t.maxDelay))
			f.kind, f.burst, f.delay = "throttled", *b, min(delay, t.maxDelay)
		}
		out = append(out, f)
	}
	return out
}

// failure is what fail reports of one key.
type failure struct {
	key   string
	kind  string // "", "first", "throttled"
	burst burst
	delay time.Duration
}

// succeed ends the bursts of keys, returning the failures they held. A
// sign-in ends its client's bursts, not its user's: the user's count is
// of every client, and a guesser's goes on.
func (t *throttle) succeed(keys ...string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, k := range keys {
		if b := t.m[k]; b != nil {
			n = max(n, b.failures)
			delete(t.m, k)
		}
	}
	return n
}

// prune forgets ended bursts when the table is full, and then, if it is
// still full, the oldest open ones: memory stays bounded whatever a
// client sends.
func (t *throttle) prune(now time.Time) {
	if len(t.m) < t.maxBursts {
		return
	}
	for k, b := range t.m {
		if b.ended(now, t.window) {
			delete(t.m, k)
		}
	}
	for k := range t.m {
		if len(t.m) < t.maxBursts {
			break
		}
		delete(t.m, k)
	}
}

// client is the address a request comes from: its peer, or, when the
// peer is a trusted proxy, the last address of X-Forwarded-For that is
// not one.
func (c *Console) client(r *http.Request) netip.Addr {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	addr := peer.Addr().Unmap()
	if !c.trusted(addr) {
		return addr
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		if a = a.Unmap(); !c.trusted(a) {
			return a
		}
		addr = a
	}
	return addr
}

// trusted reports whether a is one of Config.TrustedProxies.
func (c *Console) trusted(a netip.Addr) bool {
	for _, p := range c.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// secure reports whether the browser reached the console over TLS: the
// console serves TLS itself, Config.SecureCookies says a proxy in front
// does, or a trusted proxy says so in X-Forwarded-Proto.
func (c *Console) secure(r *http.Request) bool {
	if r.TLS != nil || c.cfg.SecureCookies {
		return true
	}
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && c.trusted(peer.Addr().Unmap()) && strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// ParseProxies reads a comma-separated list of proxy addresses or CIDR
// prefixes ("10.0.0.0/8, 192.0.2.1") for Config.TrustedProxies; an empty
// string is none.
func ParseProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: want an IP address or a CIDR prefix such as 10.0.0.0/8", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// DefineSignInFlags defines on fs the flags of the sign-in and proxy
// settings, each name after prefix: secure-cookies, trusted-proxies,
// trusted-origins, sign-in-failures, sign-in-window, sign-in-max-delay,
// sign-in-user-delay (idemctl serve uses no prefix, the gateway "console-"). The function it
// returns sets them on c once fs is parsed, or says which is wrong.
func (c *Config) DefineSignInFlags(fs *flag.FlagSet, prefix string) (apply func() error) {
	var (
		secure           bool
		proxies, origins string
		failures         int
		window, maxDelay time.Duration
		userDelay        time.Duration
	)
	fs.BoolVar(&secure, prefix+"secure-cookies", false, "mark the console's session cookie Secure: set it when a TLS-terminating proxy serves the console")
	fs.StringVar(&proxies, prefix+"trusted-proxies", "", "`ADDRS`: comma-separated addresses or CIDR prefixes of the proxies in front of the console, whose X-Forwarded-Proto (Secure cookies) and X-Forwarded-For (the client, for sign-in throttling) are believed")
	fs.StringVar(&origins, prefix+"trusted-origins", "", "`ORIGINS`: comma-separated origins (https://ops.example.com) whose POSTs the console accepts although their host is not the request's (a proxy that rewrites Host)")
	fs.IntVar(&failures, prefix+"sign-in-failures", 5, "failed console sign-ins a client may make per -"+prefix+"sign-in-window (in all, and as one user) before sign-in closes to that client for a delay that doubles with each further failure; past as many failures of one user from all clients, that user's sign-ins are held -"+prefix+"sign-in-user-delay, never refused")
	fs.DurationVar(&window, prefix+"sign-in-window", time.Minute, "the window of -"+prefix+"sign-in-failures")
	fs.DurationVar(&maxDelay, prefix+"sign-in-max-delay", 15*time.Minute, "the longest console sign-in stays closed to a client after failures")
	fs.DurationVar(&userDelay, prefix+"sign-in-user-delay", time.Second, "how long each sign-in as a user whose failures from all clients passed -"+prefix+"sign-in-failures is held before its credentials are checked")
	return func() error {
		if failures <= 0 || window <= 0 || maxDelay <= 0 || userDelay <= 0 {
			return fmt.Errorf("-%ssign-in-failures, -%[1]ssign-in-window, -%[1]ssign-in-max-delay and -%[1]ssign-in-user-delay must be positive", prefix)
		}
		ps, err := ParseProxies(proxies)
		if err != nil {
			return fmt.Errorf("-%strusted-proxies: %w", prefix, err)
		}
		for _, o := range strings.Split(origins, ",") {
			if o = strings.TrimSpace(o); o != "" {
				if err := http.NewCrossOriginProtection().AddTrustedOrigin(o); err != nil {
					return fmt.Errorf("-%strusted-origins: %w", prefix, err)
				}
				c.TrustedOrigins = append(c.TrustedOrigins, o)
			}
		}
		c.SecureCookies, c.TrustedProxies = secure, ps
		c.SignInFailures, c.SignInWindow, c.SignInMaxDelay, c.SignInUserDelay = failures, window, maxDelay, userDelay
		return nil
	}
}
