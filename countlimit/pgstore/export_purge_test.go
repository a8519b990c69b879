package pgstore

import "time"

// WithPurgeClock sets the clock PurgeEvery purges by, read once as each
// pass begins, for the tests that keep time with a stubbed clock.
func WithPurgeClock(now func() time.Time) PurgeOption {
	return func(c *purgeConfig) { c.now = now }
}
