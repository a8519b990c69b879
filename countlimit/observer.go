package countlimit

import (
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// Observer is told what a Limiter sees as it happens, for metrics: what it
// decided, and how its store answered each call and what the failure
// options did about it (timeouts, calls the circuit breaker refused, calls
// the fallback store answered). Set it with [WithObserver]; package
// promlimit turns it into Prometheus metrics, and an adapter to another
// system (an OpenTelemetry meter) is a few funcs. The breaker's changes of
// state are told by [CircuitBreaker].OnChange.
//
// Every field is optional; a nil one is never called and costs nothing.
// The funcs run synchronously on the goroutine of the call that caused
// the event, concurrently with each other, so they must be safe for
// concurrent use and must not block: count, and return. None is given
// the call's id, so none can make one a metric label by mistake (an
// error's text may name it: never make that a label either).
//
// It is a struct of funcs, as net/http/httptrace's ClientTrace is, so that
// events added later are new fields, which break no Observer already
// written.
type Observer struct {
	// Decided is called once for each rule a call decided: once for
	// Allow, AllowN, CheckLimit and Acquire, once for each Wait, WaitN and
	// WaitAcquire however many times it asked (see [Decision].Waited),
	// once per rule for AllowAll (each with the call's verdict). Peek, Refund, Reset and a Lease's
	// Release and Extend decide nothing, and a call that failed (bad
	// input, the store unavailable) decided nothing either. A decision the
	// fallback store made is told like any other.
	Decided func(Decision)
	// StoreCalled is called after each call the Limiter made to its store
	// or to its fallback store ([StoreCall].Fallback), with its operation,
	// how long it took and how it failed, and for each call the open
	// circuit breaker refused (Err is then ErrCircuitOpen's, and Took 0).
	StoreCalled func(StoreCall)
}

// Decision is what [Observer.Decided] is told.
type Decision struct {
	UseType UseType
	Allowed bool
	// Waited reports that the decision ends a Wait, WaitN or WaitAcquire
	// that slept, or waited in line behind another, before it: allowed in
	// the end, or given up (its context ended, or its deadline came
	// first). A wait is one decision however many times it asked the
	// store; the denials it waited out are not told.
	Waited bool
}

// StoreCall is what [Observer.StoreCalled] is told.
type StoreCall struct {
	Op driver.Op
	// Took is how long the store took to answer or fail, read from the
	// monotonic clock (never the Limiter's clock, which may be stubbed).
	Took time.Duration
	// Err is nil when the store answered; otherwise an ErrUnavailable,
	// which may be ErrLocked (another transaction held the id's state
	// locked), ErrCircuitOpen (the open breaker refused the call) or the
	// caller's own context ending.
	Err error
	// Failed reports that the store failed the call: Err is not nil, the
	// caller's context was still live, and it is neither ErrLocked nor
	// ErrCircuitOpen. A failed call to the store counts toward opening the
	// circuit breaker, and is what the fallback store answers for.
	Failed bool
	// TimedOut reports that the call ran out of [WithStoreTimeout]'s bound;
	// Failed is then true too.
	TimedOut bool
	// Fallback reports a call to the fallback store ([WithFallback]), made
	// after the store failed or the breaker refused the same call (told
	// first): Err nil means the fallback answered it.
	Fallback bool
}

// WithObserver makes the Limiter tell o what it sees (see [Observer]). A
// Limiter without one tells nothing and pays nothing for it; with one, it
// allocates nothing more per call than without, and reads the monotonic
// clock twice per store call when o.StoreCalled is set. A later
// WithObserver replaces an earlier one.
func WithObserver(o Observer) Option {
	return func(l *Limiter) {
		l.obs = &o
		l.guard() // store calls are timed and told on the guarded path
	}
}

// observe hands the observer to the parts that tell it what they do, once
// every option is applied, whatever their order.
func (l *Limiter) observe() {
	if g := l.guarded; g != nil {
		g.obs = l.obs
	}
}

// monoBase is what monotonic counts from.
var monoBase = time.Now()

// monotonic reads the monotonic clock. time.Since of a reading that has
// one reads only that clock, where time.Now reads the wall clock too: half
// the cost of timing a store call with two time.Now (docs/benchmarks.md).
func monotonic() time.Duration { return time.Since(monoBase) }

// decided tells the observer, if any, the verdict of check c.
func (l *Limiter) decided(op driver.Op, c *driver.Check) {
	if o := l.obs; o != nil && o.Decided != nil && (op == driver.OpAllow || op == driver.OpAcquire) {
		o.Decided(Decision{UseType: UseType(c.UseType), Allowed: c.State.Allowed})
	}
}
