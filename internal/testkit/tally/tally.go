// Package tally counts what a Limiter's Observer and its circuit breaker's
// OnChange tell about the failure options, for the tests that check what
// those options did: the counts a Prometheus adapter (promlimit) exports.
package tally

import (
	"errors"
	"sync"

	"github.com/countlimit/countlimit/countlimit"
)

// Counts are a Limiter's store failures and what its failure options did
// about them, as told since the Tally was made.
type Counts struct {
	// Failures: store calls that failed (not the caller's context ending),
	// timeouts included.
	Failures uint64
	// Timeouts: store calls that ran out of WithStoreTimeout's bound.
	Timeouts uint64
	// Rejected: calls the open circuit breaker refused.
	Rejected uint64
	// Fallbacks: calls the fallback store answered.
	Fallbacks uint64
	// Locked: calls that ended waiting for a lock another transaction held
	// (ErrLocked).
	Locked uint64
	// Breaker is the breaker's last state told, and BreakerOpenings how
	// many times it opened.
	Breaker         countlimit.BreakerState
	BreakerOpenings uint64
}

// A Tally counts; its zero value is ready. It is safe for concurrent use.
type Tally struct {
	mu sync.Mutex
	c  Counts
	// Next, when set, is told every store call after the Tally.
	Next func(countlimit.StoreCall)
}

// StoreCalled is for countlimit.Observer.StoreCalled.
func (t *Tally) StoreCalled(c countlimit.StoreCall) {
	t.mu.Lock()
	switch {
	case c.Fallback:
		if c.Err == nil {
			t.c.Fallbacks++
		}
	case errors.Is(c.Err, countlimit.ErrCircuitOpen):
		t.c.Rejected++
	default:
		if c.Failed {
			t.c.Failures++
		}
		if c.TimedOut {
			t.c.Timeouts++
		}
		if errors.Is(c.Err, countlimit.ErrLocked) {
			t.c.Locked++
		}
	}
	t.mu.Unlock()
	if t.Next != nil {
		t.Next(c)
	}
}

// BreakerChanged is for countlimit.CircuitBreaker.OnChange.
func (t *Tally) BreakerChanged(_, to countlimit.BreakerState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.c.Breaker = to
	if to == countlimit.BreakerOpen {
		t.c.BreakerOpenings++
	}
}

// Observer returns an Observer that tells t every store call.
func (t *Tally) Observer() countlimit.Observer {
	return countlimit.Observer{StoreCalled: t.StoreCalled}
}

// Counts returns what t has counted.
func (t *Tally) Counts() Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.c
}
