package countlimit

import (
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// Result is the outcome of a check. A denial is a Result with Allowed false,
// never an error.
type Result struct {
	Allowed bool
	Limit   int64
	// Used is what the current window has counted after this call; for a
	// Concurrent window, the slots held; for a Smooth window, the events
	// not yet drained at its rate (rounded up).
	Used int64
	// Remaining is Limit - Used, never below 0; for a Smooth window, its
	// burst - Used: how many events fit at once now (0 when Limit is 0).
	Remaining int64
	// ResetAt is when room comes back: the window's end, or for Sliding
	// windows when the oldest counted event leaves (now when none is
	// counted), or for Concurrent windows when the earliest lease expires
	// (now when none is held), or for Smooth windows when every counted
	// event is drained and the whole burst fits again (now when it does).
	// Zero for Lifetime windows.
	ResetAt time.Time
	// RetryAfter is 0 when Allowed, else how long until the same call can
	// succeed (the later of the penalty's end and room in every window), or
	// RetryNever when no wait helps: a full Lifetime window, or n > Limit
	// (for a Smooth window, n above its burst, or Limit 0). For a Smooth window it
	// is exact: the call's weight fits at its end. For a Concurrent window
	// it is the wait until the earliest lease expires; a Release may free a
	// slot sooner.
	RetryAfter time.Duration
	// BlockedUntil is the end of the penalty while the id sits in it.
	BlockedUntil time.Time
}

// RetryNever is Result.RetryAfter when no wait helps: the same call will
// never succeed (a full Lifetime window; n above the Limit, or above a
// Smooth window's burst; Limit 0). It is -1, below any wait, so that
// RetryAfter > 0 still means "wait this long"; Wait gives up on it at once
// (ErrInvalid).
const RetryNever time.Duration = -1

// need reports how long until a check with this state has room for n, or
// never when no wait helps. It is 0 when the request was allowed.
func need(c *driver.Check, now time.Time, n int64) (wait time.Duration, never bool) {
	s := &c.State
	if s.Allowed {
		return 0, false
	}
	if !s.BlockedUntil.IsZero() {
		wait = s.BlockedUntil.Sub(now)
	}
	if c.Smooth() {
		switch {
		case n > c.Burst || c.Limit == 0:
			return RetryNever, true
		case !s.FreeAt.IsZero(): // the rate does not fit yet: FreeAt is when it does
			return max(wait, s.FreeAt.Sub(now)), false
		}
		return wait, false
	}
	if n <= c.Limit-s.Used { // not s.Used+n: that may overflow
		return wait, false
	}
	var room time.Time
	switch {
	case n > c.Limit:
		return RetryNever, true
	case c.Span > 0:
		if s.FreeAt.IsZero() {
			return RetryNever, true
		}
		room = s.FreeAt.Add(c.Span)
	case c.TTL > 0:
		if s.Begin.IsZero() {
			return RetryNever, true // Limit 0: no lease will ever expire
		}
		room = s.Begin // the earliest lease expires

	case s.End.IsZero():
		return RetryNever, true
	default:
		room = s.End
	}
	return max(wait, room.Sub(now)), false
}

// setResult fills r from a check's state, field by field (see call.set).
func setResult(r *Result, c *driver.Check, now time.Time, retry time.Duration) {
	s := &c.State
	r.Allowed = s.Allowed
	r.Limit = c.Limit
	r.Used = s.Used
	r.Remaining = max(0, c.Limit-s.Used)
	r.ResetAt = s.End
	switch {
	case c.Smooth():
		r.Remaining = max(0, c.Burst-s.Used)
		if c.Limit == 0 {
			r.Remaining = 0 // nothing ever fits
		}
		if s.End.IsZero() {
			r.ResetAt = now
		}
	case c.Span > 0:
		r.ResetAt = now
		if s.Used > 0 {
			r.ResetAt = s.Begin.Add(c.Span)
		}
	case c.TTL > 0:
		r.ResetAt = now
		if s.Used > 0 {
			r.ResetAt = s.Begin
		}
	}
	r.RetryAfter = 0
	if !s.Allowed {
		r.RetryAfter = retry
	}
	r.BlockedUntil = s.BlockedUntil
}
