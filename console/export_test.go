package console

// HeldSignIns is how many sign-ins c holds now (Config.SignInUserDelay),
// for tests that move the clock past the hold.
func HeldSignIns(c *Console) int64 { return c.held.Load() }
