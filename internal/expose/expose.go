// Package expose hands this module's own packages (the stores, httplimit,
// the service, the CLI and the tests) what package countlimit keeps out of
// its public API: its bounds, and a few readings of its values. Package
// countlimit fills in the funcs when it is initialized, so any package
// that holds a countlimit value finds them set; each takes the countlimit
// value its doc names, and panics on any other.
package expose

import "time"

// The bounds countlimit checks its input against (its package doc lists
// them for users): so every store computes exactly (Redis scripts count in
// double precision) and no sum overflows.
const (
	// MaxIDLen is the longest id, and the longest UseType, in bytes.
	MaxIDLen = 512
	// MaxLimit is the largest Limit, and the largest weight n.
	MaxLimit = 1 << 53
	// MaxSlidingLimit is the largest Limit of a Sliding window, which keeps
	// one timestamp per counted event.
	MaxSlidingLimit = 10000
	// MaxConcurrentLimit is the largest Limit of a Concurrent window, which
	// keeps one lease per held slot.
	MaxConcurrentLimit = 10000
	// MaxDuration is the longest window, penalty or CheckLimit duration.
	MaxDuration = 100 * 365 * 24 * time.Hour
	// MaxRules is the most rules one AllowAll call takes: every store
	// decides them in one atomic step (one statement, one script), and
	// every one of them is tested at this size.
	MaxRules = 64
	// MinLeaseKeyLen is the shortest key WithLeaseKey takes.
	MinLeaseKeyLen = 16
)

// Window is what a countlimit.Window says of itself.
type Window struct {
	// Duration is the length of a Rolling, Fixed or Sliding window, the
	// lease ttl of a Concurrent one, the period of a Smooth one, and 0
	// for Calendar windows (a day or a month has no single length) and
	// Lifetime.
	Duration time.Duration
	// Burst is a Smooth window's burst; 0 for every other kind.
	Burst      int64
	Smooth     bool
	Concurrent bool
}

var (
	// WindowOf reads a countlimit.Window.
	WindowOf func(w any) Window
	// Interval is a Smooth countlimit.Window's emission interval under a
	// rule of the given limit: period/limit rounded up to the microsecond
	// (the period when limit is 0), what each event takes to drain; 0 for
	// every other kind, or a limit below 0.
	Interval func(w any, limit int64) time.Duration
	// Now reads a *countlimit.Limiter's clock, which its Results'
	// ResetAt and BlockedUntil are relative to.
	Now func(l any) time.Time
	// ValidateID reports why id cannot be a Limiter's id
	// (countlimit.ErrInvalid naming the field), nil when it can.
	ValidateID func(id string) error
	// LeaseTTL is a countlimit.Lease's ttl: its rule's, which it lives by.
	LeaseTTL func(l any) time.Duration
	// LeaseUseType is the UseType of the rule a countlimit.Lease is a slot
	// of.
	LeaseUseType func(l any) string
)
