package observe

import "time"

// ClockObserver is an optional power of an [Observer]: told every
// measurement of the engine's offset to its store's clock (see
// idem.Config.ClockSync). The engine finds it by type assertion; idemprom
// and idemotel export it as a gauge. It is called at most once per
// measurement interval, on the goroutine of the call that measured.
type ClockObserver interface {
	ClockSync(s ClockSync)
}

// ClockSync is one measurement of the engine's offset to its store's
// clock.
type ClockSync struct {
	// Offset is the store's clock minus the engine's wall clock, when Err
	// is nil: positive when the engine's clock runs behind the store's.
	Offset time.Duration
	// RTT is the measurement's round trip; half of it bounds the error of
	// Offset (plus the store's own resolution: a second for DynamoDB).
	RTT time.Duration
	// Err is why the store could not be asked; the engine keeps its last
	// good measurement meanwhile, until that is stale.
	Err error
	// Trusted is whether the engine now takes claims over: its offset is
	// known, fresh and within idem.Config.MaxClockOffset. While it is
	// false, the engine's claims carry store.ClaimParams.NoTakeover.
	Trusted bool
}
