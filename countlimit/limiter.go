package countlimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// Limiter checks rules against a Store. It is safe for concurrent use; its
// state is the store, the clock, what its failure options count and the
// lines its Wait calls stand in. Make one with New: the zero Limiter has
// no store, and its methods panic.
type Limiter struct {
	store driver.Store
	// now reads the clock at the stores' precision: to the microsecond,
	// without a monotonic reading (wallClock, or WithClock's clock cut by
	// micro), so the hot path cuts nothing.
	now     func() time.Time
	guarded *guarded    // nil without WithStoreTimeout, WithCircuitBreaker, WithFallback, WithObserver
	obs     *Observer   // nil without WithObserver
	sclock  *storeClock // nil without WithStoreClock
	// leaseKey signs lease strings; nil without WithLeaseKey.
	leaseKey []byte
	// sleep is how Wait sleeps: sleepCtx, or a test's; jitter draws the
	// time it sleeps past a RetryAfter, below its argument: randJitter, or
	// a test's.
	sleep  func(context.Context, time.Duration) error
	jitter func(time.Duration) time.Duration
	// waits are the queues of Wait's waiters, made by the first Wait.
	waits atomic.Pointer[waitQueues]
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock sets the Limiter's clock. The default is the system's wall
// clock, the one time.Now reads, read at the microsecond (the stores keep
// no finer time) and without time.Now's monotonic reading, which no
// decision uses. Readings of a clock set here are cut to the microsecond
// too. It is the clock that decides: stores take "now" from the Limiter,
// so two Limiters sharing a store should share a clock too, or correct
// theirs by the store's with [WithStoreClock]. A call that reads the clock
// outside 1970 until 2150 (UTC) fails with ErrInvalid naming the clock:
// beyond that range not every store keeps time exactly.
func WithClock(now func() time.Time) Option {
	return func(l *Limiter) {
		if now != nil {
			l.now = func() time.Time { return micro(now()) }
		}
	}
}

// New returns a Limiter over s. It panics if s is nil.
func New(s driver.Store, opts ...Option) *Limiter {
	if s == nil {
		panic("countlimit: New called with a nil Store")
	}
	l := &Limiter{store: s, now: wallClock, sleep: sleepCtx, jitter: randJitter}
	for _, o := range opts {
		o(l)
	}
	l.observe()
	return l
}

// call holds one single-rule request, pooled so the hot path allocates
// nothing: the Request goes to the Store through an interface, so it cannot
// live on the caller's stack.
type call struct {
	req    driver.Request
	checks [1]driver.Check
	// Every check writes its call: the padding keeps the calls of two
	// goroutines, which may be neighbours on the heap, off one cache line
	// (and its prefetched pair), or they would run at the speed of one.
	_ [128]byte
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// set makes c's request and returns its check. It and setCheck write field
// by field: a Request or Check built on the stack and copied in was read
// back right after it was written, and the read stalled (docs/benchmarks.md
// has the figures).
func (c *call) set(op driver.Op, id string, now time.Time, n int64) *driver.Check {
	c.req.Op = op
	c.req.ID = id
	c.req.Now = now
	c.req.N = n
	c.req.Lease = ""
	c.req.Checks = c.checks[:]
	return &c.checks[0]
}

// Allow reports whether one more event of r may happen for id now, and
// counts it if so. It is AllowN(ctx, r, id, 1).
func (l *Limiter) Allow(ctx context.Context, r Rule, id string) (Result, error) {
	var res Result
	err := l.one(ctx, &res, driver.OpAllow, r, id, 1, "", true)
	return res, err
}

// AllowN is Allow for an event of weight n: all n are counted, or none.
// n > r.Limit (for a Smooth window, n above its burst) is denied with
// RetryAfter RetryNever; n < 1 is ErrInvalid.
func (l *Limiter) AllowN(ctx context.Context, r Rule, id string, n int64) (Result, error) {
	var res Result
	err := l.one(ctx, &res, driver.OpAllow, r, id, n, "", true)
	return res, err
}

// Peek reports what Allow would answer now, counting nothing.
func (l *Limiter) Peek(ctx context.Context, r Rule, id string) (Result, error) {
	var res Result
	err := l.one(ctx, &res, driver.OpPeek, r, id, 1, "", true)
	return res, err
}

// Refund gives n events back to id's current window (the SMS was never
// sent), never going below 0, and reports the state as Peek would. It
// leaves a penalty in place.
func (l *Limiter) Refund(ctx context.Context, r Rule, id string, n int64) (Result, error) {
	var res Result
	err := l.one(ctx, &res, driver.OpRefund, r, id, n, "", true)
	return res, err
}

// Reset forgets id's state for r, penalty included ("unlock this user").
// Only r.UseType is read from r.
func (l *Limiter) Reset(ctx context.Context, r Rule, id string) error {
	if err := validateKey(r.UseType, id); err != nil {
		return wrap(driver.OpReset, r.UseType, err)
	}
	_, err := l.keyOp(ctx, driver.OpReset, r.UseType, id, "", 0)
	return err
}

// keyOp carries out an operation on a key that takes no rule: Reset, or a
// lease's Release or Extend (token and ttl are the lease's). It reports
// the State's verdict.
func (l *Limiter) keyOp(ctx context.Context, op driver.Op, ut UseType, id, token string, ttl time.Duration) (bool, error) {
	now, err := l.clockFor(ctx)
	if err != nil {
		return false, wrap(op, ut, err)
	}
	c := callPool.Get().(*call)
	defer callPool.Put(c)
	ch := c.set(op, id, now, 1)
	c.req.Lease = token
	*ch = driver.Check{UseType: string(ut), TTL: ttl}
	if err := l.do(ctx, op, &c.req); err != nil {
		return false, wrap(op, ut, err)
	}
	return ch.State.Allowed, nil
}

// one carries out a single-rule call and fills res, and tells the
// observer its decision when tell is set (Wait tells one decision for its
// tries). res is the caller's (Allow's, inlined into its caller): a Result
// returned by value was copied out right after it was written, which
// stalled the copy.
func (l *Limiter) one(ctx context.Context, res *Result, op driver.Op, r Rule, id string, n int64, lease string, tell bool) error {
	if err := checkOne(op, &r, id, n); err != nil {
		return wrap(op, r.UseType, err)
	}
	now, err := l.clockFor(ctx)
	if err != nil {
		return wrap(op, r.UseType, err)
	}
	c := callPool.Get().(*call)
	defer callPool.Put(c)
	ch := c.set(op, id, now, n)
	c.req.Lease = lease
	setCheck(ch, &r, now)
	if err := l.do(ctx, op, &c.req); err != nil {
		return wrap(op, r.UseType, err)
	}
	var retry time.Duration
	if !ch.State.Allowed {
		if op != driver.OpAllow {
			n = 1
		}
		retry, _ = need(ch, now, n)
	}
	setResult(res, ch, now, retry)
	if l.obs != nil && tell {
		l.decided(op, ch)
	}
	return nil
}

// checkOne reports why a single-rule call of op cannot be made: bad input,
// or an operation the rule's window does not take. It validates r in place.
func checkOne(op driver.Op, r *Rule, id string, n int64) error {
	if err := validate(r, id, n); err != nil {
		return err
	}
	switch concurrent := r.Window.kind == kindConcurrent; {
	case op == driver.OpAcquire && !concurrent:
		return invalidf("Rule.Window", "Acquire takes slots of a Concurrent window, got %s", r.Window)
	case concurrent && op != driver.OpAcquire && op != driver.OpPeek:
		return errCountsSlots("Rule.Window")
	}
	return nil
}

// AllowAll checks every rule for id as one atomic step: the event is counted
// for every rule, or, if any rule denies, for none. It returns one Result per
// rule, in order; each Allowed is the overall verdict and each RetryAfter the
// wait until the whole call can succeed. Only the rules that deny count a
// denial and set their penalty. No rules, more than 64, or two with
// the same UseType, is ErrInvalid.
func (l *Limiter) AllowAll(ctx context.Context, id string, rules ...Rule) ([]Result, error) {
	switch {
	case len(rules) == 0:
		return nil, wrap(driver.OpAllow, "", invalidf("rules", "none given"))
	case len(rules) > expose.MaxRules:
		return nil, wrap(driver.OpAllow, "", invalidf("rules", "%d given, at most %d (expose.MaxRules)", len(rules), expose.MaxRules))
	}
	for i, r := range rules {
		if err := validate(&r, id, 1); err != nil {
			return nil, wrap(driver.OpAllow, r.UseType, err)
		}
		if r.Window.kind == kindConcurrent {
			return nil, wrap(driver.OpAllow, r.UseType, errCountsSlots(fmt.Sprintf("rules[%d].Window", i)))
		}
		for _, prev := range rules[:i] {
			if prev.UseType == r.UseType {
				return nil, wrap(driver.OpAllow, r.UseType, invalidf(fmt.Sprintf("rules[%d].UseType", i), "%q appears twice", r.UseType))
			}
		}
	}
	now, err := l.clockFor(ctx)
	if err != nil {
		return nil, wrap(driver.OpAllow, rules[0].UseType, err)
	}
	checks := make([]driver.Check, len(rules))
	for i := range rules {
		setCheck(&checks[i], &rules[i], now)
	}
	req := &driver.Request{Op: driver.OpAllow, ID: id, Now: now, N: 1, Checks: checks}
	if err := l.do(ctx, driver.OpAllow, req); err != nil {
		return nil, wrap(driver.OpAllow, rules[0].UseType, err)
	}
	var retry time.Duration
	for i := range checks {
		d, never := need(&checks[i], now, 1)
		switch {
		case never:
			retry = RetryNever
		case retry >= 0 && d > retry:
			retry = d
		}
	}
	out := make([]Result, len(checks))
	for i := range checks {
		setResult(&out[i], &checks[i], now, retry)
		if l.obs != nil {
			l.decided(driver.OpAllow, &checks[i])
		}
	}
	return out, nil
}

// CheckLimit is the generic CheckLimit(useType, id, limit, duration,
// beginTime) model many systems use for business limits: the window is
// [beginTime, beginTime+duration), and a zero beginTime means now. If the
// stored window is current and has counted limit events it returns false;
// otherwise it counts the event (a stale window restarts at beginTime) and
// returns true. Pass today's midnight as beginTime for a natural-day limit.
// It shares its counter with Allow for the same useType and id. Limit 0
// allows nothing (some implementations of the model treat it as no limit).
// beginTime must lie from 1970 until 2150 (UTC), as the Limiter's clock
// must: outside that range it is ErrInvalid and nothing is written.
//
// A window that has already ended (beginTime+duration at or before now)
// allows every call: each finds the stored window stale and restarts it,
// as the model does. Pass a beginTime whose window holds now.
func (l *Limiter) CheckLimit(ctx context.Context, useType UseType, id string, limit int64, duration time.Duration, beginTime time.Time) (bool, error) {
	if err := validateKey(useType, id); err != nil {
		return false, wrap(driver.OpAllow, useType, err)
	}
	if limit < 0 || limit > expose.MaxLimit {
		return false, wrap(driver.OpAllow, useType, invalidf("limit", "must be 0 to 2^53, got %d", limit))
	}
	if duration < time.Microsecond || duration > expose.MaxDuration {
		return false, wrap(driver.OpAllow, useType, invalidf("duration", "must be 1µs to 100 years, got %v", duration))
	}
	if !beginTime.IsZero() {
		if err := checkTime("beginTime", beginTime); err != nil {
			return false, wrap(driver.OpAllow, useType, err)
		}
	}
	now, err := l.clockFor(ctx)
	if err != nil {
		return false, wrap(driver.OpAllow, useType, err)
	}
	begin := now
	if !beginTime.IsZero() {
		begin = micro(beginTime)
	}
	c := callPool.Get().(*call)
	defer callPool.Put(c)
	ch := c.set(driver.OpAllow, id, now, 1)
	*ch = driver.Check{UseType: string(useType), Limit: limit, Begin: begin, End: begin.Add(truncMicro(duration))}
	if err := l.do(ctx, driver.OpAllow, &c.req); err != nil {
		return false, wrap(driver.OpAllow, useType, err)
	}
	if l.obs != nil {
		l.decided(driver.OpAllow, ch)
	}
	return ch.State.Allowed, nil
}

// reading reads the Limiter's clock (corrected to the store's with
// WithStoreClock), to the microsecond as the stores keep time: what a
// Result's ResetAt and BlockedUntil are relative to.
func (l *Limiter) reading() time.Time { return l.clock() }

// setCheck turns a validated rule into the explicit form a Store needs, in
// place (see call.set).
func setCheck(c *driver.Check, r *Rule, now time.Time) {
	c.UseType = string(r.UseType)
	c.Limit = r.Limit
	c.Begin, c.End = bounds(now, r.Window)
	c.Span, c.TTL, c.Interval, c.Burst = 0, 0, 0, 0
	switch r.Window.kind {
	case kindSliding:
		c.Span = truncMicro(r.Window.d)
	case kindConcurrent:
		c.TTL = truncMicro(r.Window.d)
	case kindSmooth:
		c.Interval, c.Burst = r.Window.iv, r.Window.burst
		if c.Interval == 0 { // a rule validated as a copy (AllowAll)
			c.Interval = interval(r.Window.d, r.Limit)
		}
	}
	c.Block = truncMicro(r.Block)
	c.Kind = r.Window.kindName()
	c.State = driver.State{}
}

func wrap(op driver.Op, ut UseType, err error) error {
	if ut == "" {
		return fmt.Errorf("countlimit: %s: %w", op, err)
	}
	return fmt.Errorf("countlimit: %s %q: %w", op, ut, err)
}
