package countlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/internal/errs"
)

// ErrCircuitOpen is returned, wrapped, while a circuit breaker (see
// [WithCircuitBreaker]) answers for a store that keeps failing, without
// calling it. It wraps ErrUnavailable, so errors.Is(err, ErrUnavailable)
// holds too and a fail-open or fail-closed policy applies as for any store
// failure.
var ErrCircuitOpen = fmt.Errorf("%w: circuit breaker open", ErrUnavailable)

// ErrLocked is returned, wrapped, by a check that was not decided because
// another transaction holds the id's state locked (or has inserted it and
// not committed), typically a check made inside a caller's own pgx.Tx that
// has not committed yet, and the call's context (or [WithStoreTimeout]'s
// bound) ended before the lock was released. pgstore on a pool returns it:
// it waits for such a row on its own, never holding other ids' calls or
// the pool's connections behind the lock. It wraps
// ErrUnavailable, so a fail-open or fail-closed policy applies as for any
// call that could not be decided; but the store is not failing: it does
// not count toward the circuit breaker (nor is it a failed or timed-out
// [StoreCall]), and the fallback store does not answer for it.
var ErrLocked = errs.ErrLocked

// WithStoreTimeout bounds every store call the Limiter makes to d, on top of
// the caller's own context: a store that does not answer within d fails the
// call with ErrUnavailable (wrapping context.DeadlineExceeded), so a stalled
// database (a table lock, a paused server) turns into fast errors that a
// fail-open policy, a fallback or a circuit breaker can act on, instead of
// holding every caller for the whole stall. d <= 0 means no bound (the
// default).
//
// The bound works through the context the store receives: pgstore and
// memstore honour it; redisstore does only when its client was made with
// ContextTimeoutEnabled: true (otherwise the client's ReadTimeout applies).
// A timed-out call may still have been counted by the store.
func WithStoreTimeout(d time.Duration) Option {
	return func(l *Limiter) {
		if d > 0 {
			l.guard().timeout = d
		}
	}
}

// CircuitBreaker configures [WithCircuitBreaker]. Its zero value is usable:
// every field has a default.
type CircuitBreaker struct {
	// Failures is how many store calls in a row must fail for the breaker
	// to open (default 5). A call counts as failed when the store returned
	// an error while the caller's own context was still live, so callers
	// that give up do not open it.
	Failures int
	// CoolDown is how long the breaker stays open before it lets one call
	// through to probe the store (default 1s).
	CoolDown time.Duration
	// OnChange, when not nil, is called after every change of state, with
	// the states before and after, once per change (not once per call)
	// and one change at a time, in the order they happened: the place to
	// log an outage and its end, and to export the state
	// (promlimit's Metrics.BreakerChanged). It runs on the goroutine of
	// the call that caused the change and must not block nor call the
	// Limiter.
	OnChange func(from, to BreakerState)
}

// BreakerState is the state of a circuit breaker.
type BreakerState int32

// The states of a circuit breaker. A Limiter without one stays
// BreakerClosed.
const (
	// BreakerClosed: calls go to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: the store failed CircuitBreaker.Failures times in a row;
	// calls fail at once with ErrCircuitOpen (or go to the fallback store)
	// until the cool-down ends.
	BreakerOpen
	// BreakerHalfOpen: the cool-down is over and one call is probing the
	// store; the others fail at once as while open. The probe's success
	// closes the breaker, its failure opens it for another cool-down.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "state?"
}

// WithCircuitBreaker makes the Limiter stop calling a store that keeps
// failing: after cb.Failures failed calls in a row it answers ErrCircuitOpen
// at once (or asks the fallback store, see [WithFallback]) for cb.CoolDown,
// then lets one call probe the store, and closes again when the probe
// succeeds. Callers stop waiting on a store that is down, and the store gets
// room to come back. CircuitBreaker.OnChange tells each change of its
// state, and [Observer].StoreCalled each call it refused.
func WithCircuitBreaker(cb CircuitBreaker) Option {
	return func(l *Limiter) {
		if cb.Failures <= 0 {
			cb.Failures = 5
		}
		if cb.CoolDown <= 0 {
			cb.CoolDown = time.Second
		}
		l.guard().breaker = &breaker{cfg: cb}
	}
}

// WithFallback makes the Limiter decide with fallback (typically a
// memstore.Store) while its store is unavailable: when a call to the store
// fails with ErrUnavailable (but not [ErrLocked]: the store is up, and
// another transaction holds the id), or the circuit breaker is open, Allow, AllowN,
// AllowAll, Peek and CheckLimit are answered by fallback instead, as
// rate-limiter-flexible's "insurance" limiter does.
//
// The fallback's counts are its own: they start from zero, are per process,
// and are not copied back when the store returns. A fleet of n processes
// each with a fallback may allow up to n times a rule's Limit during an
// outage. Refund and Reset never fall back: they fail with ErrUnavailable,
// so nothing an operator does is silently applied to one process only; nor
// do Acquire, a Lease's Release and Extend, and Peek of a Concurrent rule,
// whose slots are the store's alone.
// Without this option the Limiter fails closed: the call returns
// ErrUnavailable. [Observer].StoreCalled tells each call the fallback
// answered.
func WithFallback(fallback driver.Store) Option {
	return func(l *Limiter) {
		if fallback != nil {
			l.guard().fallback = fallback
		}
	}
}

// guarded holds the failure options; a Limiter without any has none, and
// its calls go straight to the store.
type guarded struct {
	timeout  time.Duration
	breaker  *breaker
	fallback driver.Store
	obs      *Observer // nil without WithObserver
}

func (l *Limiter) guard() *guarded {
	if l.guarded == nil {
		l.guarded = new(guarded)
	}
	return l.guarded
}

// do runs r, whose operation is op, on the store with the failure
// options applied.
func (l *Limiter) do(ctx context.Context, op driver.Op, r *driver.Request) error {
	g := l.guarded
	if g == nil {
		return driver.Unavailable(l.store.Do(ctx, r))
	}
	now := r.Now // the call's clock read; the breaker needs no other
	var err error
	if sc := l.sclock; sc != nil && !sc.synced() {
		// Only a fallback gets here (clockFor fails the call otherwise):
		// the store's time is unknown, so the store is not written.
		err = errClockUnknown
	} else if probe, ok := g.breaker.admit(now); ok {
		timed := g.obs != nil && g.obs.StoreCalled != nil
		var start time.Duration
		if timed {
			start = monotonic()
		}
		var timedOut bool
		timedOut, err = g.call(ctx, l.store, r)
		locked := err != nil && errors.Is(err, ErrLocked)
		// A lock that another transaction holds is not the store failing,
		// nor is a request the store refused as invalid (a kind of window
		// it does not support): that store answered.
		refused := errors.Is(err, ErrInvalid)
		failed := err != nil && ctx.Err() == nil && !locked && !refused
		if timed {
			g.obs.StoreCalled(StoreCall{Op: op, Took: monotonic() - start, Err: err, Failed: failed, TimedOut: timedOut})
		}
		g.breaker.record(now, probe, err == nil || refused, failed)
	} else {
		err = fmt.Errorf("%w (%d failures in a row; next probe in %v)", ErrCircuitOpen, g.breaker.cfg.Failures, g.breaker.wait(now).Round(time.Millisecond))
		if g.obs != nil && g.obs.StoreCalled != nil {
			g.obs.StoreCalled(StoreCall{Op: op, Err: err})
		}
	}
	// Only counting calls fall back: not Refund or Reset, nor anything of a
	// Concurrent rule, whose slots are the store's alone; and only when the
	// store is unavailable, not when another transaction holds the id or
	// the store refused the request.
	if err == nil || g.fallback == nil || (op != driver.OpAllow && op != driver.OpPeek) || r.Checks[0].TTL > 0 || ctx.Err() != nil ||
		errors.Is(err, ErrLocked) || errors.Is(err, ErrInvalid) {
		return err
	}
	timed := g.obs != nil && g.obs.StoreCalled != nil
	var start time.Duration
	if timed {
		start = monotonic()
	}
	timedOut, ferr := g.call(ctx, g.fallback, r)
	if timed {
		g.obs.StoreCalled(StoreCall{Op: op, Took: monotonic() - start, Err: ferr, Failed: ferr != nil && ctx.Err() == nil, TimedOut: timedOut, Fallback: true})
	}
	if ferr != nil {
		return fmt.Errorf("%w; the fallback store failed too: %w", err, ferr)
	}
	return nil
}

// call runs r on s within the store timeout, and reports whether it ran
// out of it.
func (g *guarded) call(ctx context.Context, s driver.Store, r *driver.Request) (timedOut bool, err error) {
	if g.timeout <= 0 {
		return false, driver.Unavailable(s.Do(ctx, r))
	}
	tctx, cancel := context.WithTimeout(ctx, g.timeout)
	err = s.Do(tctx, r)
	if err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
		what := "no answer"
		if errors.Is(err, ErrLocked) {
			what = "the lock not released" // not the store's timeout
		} else {
			timedOut = true
		}
		err = fmt.Errorf("%s within the store timeout of %v: %w", what, g.timeout, err)
	}
	cancel()
	return timedOut, driver.Unavailable(err)
}

// breaker is a consecutive-failure circuit breaker. A nil breaker admits
// every call. Its times come from the Limiter's clock.
type breaker struct {
	cfg CircuitBreaker

	open  atomic.Bool  // state != BreakerClosed: the fast path reads only this
	fails atomic.Int64 // failures in a row while closed

	mu sync.Mutex
	// Under mu:
	state   BreakerState
	until   time.Time // while open: the end of the cool-down
	probing bool      // while half-open: a probe is out

	// told is held while OnChange is told of a change: taken under mu, so
	// that changes are told one at a time, in the order they were made.
	told sync.Mutex
}

// admit reports whether a call may go to the store now, and whether it is
// the half-open probe.
func (b *breaker) admit(now time.Time) (probe, ok bool) {
	if b == nil || !b.open.Load() {
		return false, true
	}
	b.mu.Lock()
	var from BreakerState
	changed := false
	switch {
	case b.state == BreakerClosed: // closed since the load above
		ok = true
	case b.state == BreakerOpen && !now.Before(b.until):
		from, changed = b.state, true
		b.state, b.probing = BreakerHalfOpen, true
		probe, ok = true, true
	case b.state == BreakerHalfOpen && !b.probing:
		b.probing = true
		probe, ok = true, true
	}
	b.unlock(from, BreakerHalfOpen, changed)
	return probe, ok
}

// record takes the outcome of an admitted call: ok when it succeeded,
// failed when the store failed it (not the caller's context).
func (b *breaker) record(now time.Time, probe, ok, failed bool) {
	if b == nil {
		return
	}
	if !probe {
		// Closed, or admitted just before the breaker opened. Lock-free
		// unless this failure is the one that opens it.
		switch {
		case ok && b.fails.Load() != 0:
			b.fails.Store(0)
		case failed && b.fails.Add(1) >= int64(b.cfg.Failures):
			b.trip(now)
		}
		return
	}
	b.mu.Lock()
	from := b.state
	switch {
	case ok:
		b.state, b.probing = BreakerClosed, false
		b.fails.Store(0)
	case failed:
		b.state, b.until, b.probing = BreakerOpen, now.Add(b.cfg.CoolDown), false
	default:
		b.probing = false // the caller gave up: the next call probes
	}
	to := b.state
	b.open.Store(to != BreakerClosed)
	b.unlock(from, to, from != to)
}

// trip opens a closed breaker.
func (b *breaker) trip(now time.Time) {
	b.mu.Lock()
	if b.state != BreakerClosed {
		b.mu.Unlock()
		return
	}
	b.state, b.until = BreakerOpen, now.Add(b.cfg.CoolDown)
	b.fails.Store(0)
	b.open.Store(true)
	b.unlock(BreakerClosed, BreakerOpen, true)
}

// wait is how long until the next probe may go.
func (b *breaker) wait(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(0, b.until.Sub(now))
}

// unlock releases mu, which the caller holds, and tells OnChange of the
// change from to to that the caller made under it, if changed.
func (b *breaker) unlock(from, to BreakerState, changed bool) {
	if !changed || b.cfg.OnChange == nil {
		b.mu.Unlock()
		return
	}
	b.told.Lock()
	b.mu.Unlock()
	defer b.told.Unlock()
	b.cfg.OnChange(from, to)
}
