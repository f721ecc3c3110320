// Config: the engine's settings, their defaults and their validation.

package idem

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/seed-a1b882c0/idem/observe"
	"github.com/seed-a1b882c0/idem/store"
)

// envDisabled names the environment variable that turns idempotency off:
// when it is "1" or "true" at [New], every call runs the operation directly,
// with no store calls. It exists for tests of code that uses idem; never set
// it in production. The engine logs a warning when it is on.
const envDisabled = "IDEM_DISABLED"

// Config configures an [Engine]. A nil *Config means all defaults; every
// field documents its default.
type Config struct {
	// Expiry is how long a COMPLETED or FAILED record is replayed, and how
	// long any claim lives at most. Default 1h.
	Expiry time.Duration

	// Lease is how long a claim holds the key against takeover without
	// hearing from its holder. A call whose context has a deadline takes
	// the time to the deadline as its first lease, so that a retry takes
	// over soon after the deadline when the holder is gone; while the
	// operation runs the lease is renewed all the same, past the deadline
	// if the operation runs on (most handlers do not stop when their
	// context ends), by the shorter of Lease and the deadline's lease.
	// Default 30s, or Expiry when that is shorter.
	Lease time.Duration

	// RenewInterval is how often the lease is renewed while the operation
	// runs (a fenced Extend to now + lease): at most a third of the lease.
	// A lease taken from a deadline further off than Lease is renewed from
	// when it has less than Lease less an interval left. Default: a third
	// of Lease. Negative disables renewal. A context marked
	// [EndsAtDeadline] (an AWS Lambda invocation, ended at its deadline)
	// keeps its deadline as its lease, not renewed.
	RenewInterval time.Duration

	// HoldCrashed sets the takeover policy of every operation of the
	// engine to Hold: a claim whose holder is gone (its lease passed with
	// no outcome written: a crash, a kill, a lost network) is not taken
	// over and run again; the record stays IN_PROGRESS, stuck and marked
	// held, and calls get [ErrHeld] until a person settles it (idemctl
	// resolve or release, the console, a token's write) or it expires.
	// At most once, at the price of a person. Default false: the policy
	// Rerun, where a call after the lease takes the key over and runs the
	// operation again. One operation gets Hold with [OpConfig],
	// [Request] or [Identity]'s HoldCrashed, or its adapter's.
	HoldCrashed bool

	// Wait is how long a call waits for another holder of its key to
	// finish, polling with backoff and jitter, before failing with
	// [ErrInProgress]. Zero (the default) fails fast.
	Wait time.Duration

	// WaitBackoff is the first poll interval while waiting; it doubles up
	// to MaxWaitBackoff, each wait jittered down to half. Defaults 20ms
	// and 1s.
	WaitBackoff, MaxWaitBackoff time.Duration

	// MaxResultBytes caps an encoded result. A successful result over the
	// cap is returned to its caller but not stored: the key is marked
	// FAILED with code [CodeResultTooLarge], so retries get
	// [ErrResultTooLarge] and the operation does not run again. Zero (the
	// default) leaves the limit to the store.
	MaxResultBytes int

	// WriteTimeout bounds the outcome write made after the operation
	// returned (complete, fail, release), retries included: a write that
	// fails on a transient fault (a reset connection, a timeout) is retried
	// with backoff and jitter, each attempt bounded by a third of
	// WriteTimeout and by half the lease (at least a second: an attempt
	// that hangs is tried again on another connection before the lease
	// can lapse), while the lease keeps being renewed. Only when
	// WriteTimeout has passed does the engine give up (logged, counted as
	// observe.OutcomeStoreError). A write refused with store.ErrMisconfigured
	// (credentials refused, a spill bucket gone) is not retried: it fails
	// at once, logged and counted once. These writes are made even when
	// the caller's context is cancelled. Default 10s.
	WriteTimeout time.Duration

	// CacheEntries, above zero, turns on the local cache of COMPLETED
	// records and bounds it to that many: a hit replays with no store
	// call. IN_PROGRESS and FAILED records are never cached, and an entry
	// is dropped once its record's ExpiresAt passes. Default 0: off.
	CacheEntries int
	// CacheBytes bounds the summed result sizes the cache holds. Default
	// 64 MiB. A result larger than a quarter of it is not cached.
	CacheBytes int

	// Codec encodes results. Default [JSONCodec], which stores a []byte or
	// json.RawMessage result as it is (not base64 or re-encoded JSON).
	Codec Codec

	// Clock is the source of time. Default [store.SystemClock]. When the
	// engine measures its store's clock (ClockSync), every timestamp it
	// writes and compares is this clock corrected to the store's:
	// [Engine.Now] reads it, and [Engine.Config] returns this clock as
	// given.
	Clock store.Clock

	// ClockSync is how often the engine measures its offset to the clock
	// of a store that tells its time (store.ServerTimer: redisstore,
	// pgstore, dynamostore), so that leases and expiry are decided on the
	// store's clock and callers' clocks need not agree. The measurement is
	// one store round trip, made by the first claim or token write after
	// the interval has passed (never in the background, at most once per
	// interval). See docs/state-machine.md, "One clock". Default 10s when
	// Clock is the system clock; with an injected Clock, 0 leaves it off
	// (the test that injected the clock owns time). Negative disables.
	// Stores in the caller's process (memstore, boltstore) share its clock
	// and are never measured.
	ClockSync time.Duration

	// MaxClockOffset bounds the offset to the store's clock within which
	// the engine takes over claims whose lease has passed. Beyond it, or
	// while the offset is unknown (not yet measured, or the last
	// measurement is older than three ClockSync intervals, or the local
	// clock stepped since), the engine logs it, tells the observer
	// (observe.ClockObserver) and takes over no IN_PROGRESS record
	// (store.ClaimParams.NoTakeover) until it is back within the bound.
	// Default 1m.
	MaxClockOffset time.Duration

	// Logger receives warnings and errors. Default slog.Default().
	Logger *slog.Logger

	// Observer is told about every outcome and store call (see package
	// observe; idemprom and idemotel export them). An observer that is
	// also an observe.Tracer (idemotel.Tracer) traces every call. Default:
	// none.
	Observer observe.Observer

	// Owner prefixes the owner of every claim, for people reading logs.
	// The engine adds a random id of its own and a sequence number, so
	// owners stay unique per claim whatever this is. Default
	// "<hostname>/<pid>".
	Owner string

	// FailOpen runs the operation without protection when the store
	// fails to answer a claim. Default false: the call fails closed with
	// [ErrStore] and the operation does not run.
	FailOpen bool

	// Disabled runs every operation directly, with no store calls. Also
	// set by the IDEM_DISABLED environment variable. For tests only.
	Disabled bool

	// TokenKey, when set, signs every token the engine hands out ([Token]:
	// an HMAC-SHA256 of its contents) and makes every write through a
	// token check the signature before any store call, refusing a forged,
	// altered or unsigned token with [ErrInvalidToken]. Set it where tokens
	// cross a trust boundary; engines that share tokens share the key. At
	// least 16 bytes of a secret. Default none: tokens are not
	// authenticated.
	TokenKey []byte
}

// WithDefaults returns a copy of c with every zero field set to its default.
// A nil c gives all defaults.
func (c *Config) WithDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Expiry == 0 {
		out.Expiry = time.Hour
	}
	if out.Lease == 0 {
		out.Lease = min(30*time.Second, out.Expiry)
	}
	if out.RenewInterval == 0 {
		out.RenewInterval = out.Lease / 3
	}
	if out.WaitBackoff == 0 {
		out.WaitBackoff = 20 * time.Millisecond
	}
	if out.MaxWaitBackoff == 0 {
		out.MaxWaitBackoff = time.Second
	}
	if out.WriteTimeout == 0 {
		out.WriteTimeout = 10 * time.Second
	}
	if out.Codec == nil {
		out.Codec = JSONCodec{}
	}
	if out.ClockSync == 0 {
		switch out.Clock.(type) {
		case nil, store.SystemClock:
			out.ClockSync = 10 * time.Second
		default:
			out.ClockSync = -1
		}
	}
	if out.MaxClockOffset == 0 {
		out.MaxClockOffset = time.Minute
	}
	if out.Clock == nil {
		out.Clock = store.SystemClock{}
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Observer == nil {
		out.Observer = nopObserver{}
	}
	if out.Owner == "" {
		out.Owner = defaultOwner()
	}
	if v, err := strconv.ParseBool(os.Getenv(envDisabled)); err == nil && v {
		out.Disabled = true
	}
	return out
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case len(c.TokenKey) > 0 && len(c.TokenKey) < 16:
		return bad("TokenKey has %d bytes; use a secret of at least 16 random bytes", len(c.TokenKey))
	case c.Expiry < time.Second:
		return bad("Expiry is %v; it must be at least 1s (records must outlive their claims)", c.Expiry)
	case c.Lease < 10*time.Millisecond:
		return bad("Lease is %v; it must be at least 10ms", c.Lease)
	case c.CacheEntries < 0 || c.CacheBytes < 0:
		return bad("CacheEntries %d and CacheBytes %d must not be negative; 0 turns the cache off (CacheEntries) or means 64 MiB (CacheBytes)", c.CacheEntries, c.CacheBytes)
	case c.Lease > c.Expiry:
		return bad("Lease %v is longer than Expiry %v; raise Expiry or shorten Lease", c.Lease, c.Expiry)
	case c.RenewInterval >= c.Lease:
		return bad("RenewInterval %v must be shorter than Lease %v, or the lease runs out between renewals", c.RenewInterval, c.Lease)
	case c.Wait < 0:
		return bad("Wait is %v; use 0 to fail fast", c.Wait)
	case c.WaitBackoff <= 0 || c.MaxWaitBackoff < c.WaitBackoff:
		return bad("WaitBackoff %v and MaxWaitBackoff %v must be positive and ordered", c.WaitBackoff, c.MaxWaitBackoff)
	case c.MaxResultBytes < 0:
		return bad("MaxResultBytes is %d; use 0 for no engine limit", c.MaxResultBytes)
	case c.ClockSync > 0 && c.ClockSync < 10*time.Millisecond:
		return bad("ClockSync is %v; measure at most every 10ms, or use a negative value to disable", c.ClockSync)
	case c.MaxClockOffset < 0:
		return bad("MaxClockOffset is %v; it must be positive", c.MaxClockOffset)
	case c.WriteTimeout < 0:
		return bad("WriteTimeout is %v; it must be positive", c.WriteTimeout)
	}
	return nil
}

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// randomID returns 8 random hex digits.
func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
