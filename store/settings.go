package store

import "context"

// SettingsChecker is an optional power of a store: reading, while it runs,
// the settings of its backend that the contract depends on and that an
// operator can change under a running program — Redis's maxmemory-policy,
// which lets Redis drop records before their expiry (a forgotten record
// lets its operation run again). A store checks the same settings when it
// is opened; this is for the time after. package monitor calls it on every
// sweep, logs a check that changes its answer and hands the answers to
// Config.OnSweep (idemctl exports them as idem_store_misconfigured). Find
// it by type assertion.
type SettingsChecker interface {
	// CheckSettings reads the backend's settings, changing nothing, and
	// answers one SettingCheck per setting it checks, under the same
	// names every time (none when the store was told to accept what they
	// would find, such as redisstore's Config.AllowEviction). For each:
	//
	//   - Err nil: the setting keeps records until their expiry;
	//   - Err matching [ErrMisconfigured]: it does not; the error names
	//     the node and the setting, and says what to set;
	//   - Err matching [ErrUnavailable]: the setting could not be read
	//     (the server did not answer, or refused the store's user the
	//     read: the error says so).
	CheckSettings(ctx context.Context) []SettingCheck
}

// SettingCheck is one answer of [SettingsChecker.CheckSettings].
type SettingCheck struct {
	// Name names the check, short and stable (a metric label):
	// "eviction".
	Name string
	// Err is nil when the setting is right; see [SettingsChecker].
	Err error
}
