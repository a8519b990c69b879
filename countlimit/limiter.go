package countlimit

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"
)

// UseType names what is limited, e.g. "password.change" or "sms.code". One
// UseType is one counter per id.
type UseType string

// MaxIDLen is the longest id, and the longest UseType, in bytes.
const MaxIDLen = 512

// Bounds on numbers, so every store computes exactly (Redis scripts count in
// double precision) and no sum overflows.
const (
	// MaxLimit is the largest Limit, and the largest weight n.
	MaxLimit = 1 << 53
	// MaxSlidingLimit is the largest Limit of a Sliding window, which keeps
	// one timestamp per counted event. Use Fixed or Rolling for more.
	MaxSlidingLimit = 10000
	// MaxDuration is the longest window, penalty or CheckLimit duration.
	MaxDuration = 100 * 365 * 24 * time.Hour
)

// Rule is a limit: at most Limit events of UseType per Window for each id.
// Rules are plain values; the Limiter and its store keep no configuration, so
// a changed Limit applies at once to the current window. A changed Window
// applies from the next window (a Lifetime window has none: Reset the id).
type Rule struct {
	UseType UseType
	// Limit is how many events a window allows; 0 allows none.
	Limit  int64
	Window Window
	// Block, when positive, is a penalty box: a denial puts the id in it for
	// Block, and every call is denied until it ends, even after the window
	// resets. Denials during the penalty do not extend it. Reset clears it.
	Block time.Duration
}

// Result is the outcome of a check. A denial is a Result with Allowed false,
// never an error.
type Result struct {
	Allowed bool
	Limit   int64
	// Used is what the current window has counted after this call.
	Used int64
	// Remaining is Limit - Used, never below 0.
	Remaining int64
	// ResetAt is when room comes back: the window's end, or for Sliding
	// windows when the oldest counted event leaves (now when none is
	// counted). Zero for Lifetime windows.
	ResetAt time.Time
	// RetryAfter is 0 when Allowed, else how long until the same call can
	// succeed (the later of the penalty's end and room in every window), or
	// -1 when no wait helps: a full Lifetime window, or n > Limit.
	RetryAfter time.Duration
	// BlockedUntil is the end of the penalty while the id sits in it.
	BlockedUntil time.Time
}

// Limiter checks rules against a Store. It is safe for concurrent use; its
// state is the store, the clock and what its failure options count. Make
// one with New: the zero Limiter has no store, and its methods panic.
type Limiter struct {
	store   Store
	now     func() time.Time
	guarded *guarded    // nil without WithStoreTimeout, WithCircuitBreaker, WithFallback
	sclock  *storeClock // nil without WithStoreClock
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock sets the Limiter's clock (default time.Now). It is the only clock
// that decides anything: stores take "now" from the Limiter, so two Limiters
// sharing a store should share a clock too.
func WithClock(now func() time.Time) Option {
	return func(l *Limiter) {
		if now != nil {
			l.now = now
		}
	}
}

// New returns a Limiter over s. It panics if s is nil.
func New(s Store, opts ...Option) *Limiter {
	if s == nil {
		panic("countlimit: New called with a nil Store")
	}
	l := &Limiter{store: s, now: time.Now}
	for _, o := range opts {
		o(l)
	}
	return l
}

// call holds one single-rule request, pooled so the hot path allocates nothing.
type call struct {
	req    Request
	reqs   [1]*Request
	checks [1]Check
}

var callPool = sync.Pool{New: func() any {
	c := new(call)
	c.reqs[0] = &c.req
	return c
}}

// Allow reports whether one more event of r may happen for id now, and
// counts it if so. It is AllowN(ctx, r, id, 1).
func (l *Limiter) Allow(ctx context.Context, r Rule, id string) (Result, error) {
	return l.one(ctx, OpAllow, r, id, 1)
}

// AllowN is Allow for an event of weight n: all n are counted, or none.
// n > r.Limit is denied with RetryAfter -1; n < 1 is ErrInvalid.
func (l *Limiter) AllowN(ctx context.Context, r Rule, id string, n int64) (Result, error) {
	return l.one(ctx, OpAllow, r, id, n)
}

// Peek reports what Allow would answer now, counting nothing.
func (l *Limiter) Peek(ctx context.Context, r Rule, id string) (Result, error) {
	return l.one(ctx, OpPeek, r, id, 1)
}

// Refund gives n events back to id's current window (the SMS was never
// sent), never going below 0, and reports the state as Peek would. It
// leaves a penalty in place.
func (l *Limiter) Refund(ctx context.Context, r Rule, id string, n int64) (Result, error) {
	return l.one(ctx, OpRefund, r, id, n)
}

// Reset forgets id's state for r, penalty included ("unlock this user").
// Only r.UseType is read from r.
func (l *Limiter) Reset(ctx context.Context, r Rule, id string) error {
	if err := validateKey(r.UseType, id); err != nil {
		return wrap(OpReset, r.UseType, err)
	}
	now, err := l.clockFor(ctx)
	if err != nil {
		return wrap(OpReset, r.UseType, err)
	}
	c := callPool.Get().(*call)
	defer callPool.Put(c)
	c.checks[0] = Check{UseType: r.UseType}
	c.req = Request{Op: OpReset, ID: id, Now: now, Checks: c.checks[:]}
	if err := l.do(ctx, OpReset, c.reqs[:]); err != nil {
		return wrap(OpReset, r.UseType, err)
	}
	return nil
}

func (l *Limiter) one(ctx context.Context, op Op, r Rule, id string, n int64) (Result, error) {
	if err := validate(r, id, n); err != nil {
		return Result{}, wrap(op, r.UseType, err)
	}
	now, err := l.clockFor(ctx)
	if err != nil {
		return Result{}, wrap(op, r.UseType, err)
	}
	c := callPool.Get().(*call)
	defer callPool.Put(c)
	c.checks[0] = check(r, now)
	c.req = Request{Op: op, ID: id, Now: now, N: n, Checks: c.checks[:]}
	if err := l.do(ctx, op, c.reqs[:]); err != nil {
		return Result{}, wrap(op, r.UseType, err)
	}
	ch := &c.checks[0]
	if op != OpAllow {
		n = 1
	}
	retry, _ := need(ch, now, n)
	return result(ch, now, retry), nil
}

// AllowAll checks every rule for id as one atomic step: the event is counted
// for every rule, or, if any rule denies, for none. It returns one Result per
// rule, in order; each Allowed is the overall verdict and each RetryAfter the
// wait until the whole call can succeed. Only the rules that deny count a
// denial and set their penalty. No rules, or two with the same UseType, is
// ErrInvalid.
func (l *Limiter) AllowAll(ctx context.Context, id string, rules ...Rule) ([]Result, error) {
	if len(rules) == 0 {
		return nil, wrap(OpAllow, "", invalidf("rules", "none given"))
	}
	for i, r := range rules {
		if err := validate(r, id, 1); err != nil {
			return nil, wrap(OpAllow, r.UseType, err)
		}
		for _, prev := range rules[:i] {
			if prev.UseType == r.UseType {
				return nil, wrap(OpAllow, r.UseType, invalidf(fmt.Sprintf("rules[%d].UseType", i), "%q appears twice", r.UseType))
			}
		}
	}
	now, err := l.clockFor(ctx)
	if err != nil {
		return nil, wrap(OpAllow, rules[0].UseType, err)
	}
	checks := make([]Check, len(rules))
	for i, r := range rules {
		checks[i] = check(r, now)
	}
	req := &Request{Op: OpAllow, ID: id, Now: now, N: 1, Checks: checks}
	if err := l.do(ctx, OpAllow, []*Request{req}); err != nil {
		return nil, wrap(OpAllow, rules[0].UseType, err)
	}
	var retry time.Duration
	for i := range checks {
		d, never := need(&checks[i], now, 1)
		switch {
		case never:
			retry = -1
		case retry >= 0 && d > retry:
			retry = d
		}
	}
	out := make([]Result, len(checks))
	for i := range checks {
		out[i] = result(&checks[i], now, retry)
	}
	return out, nil
}

// CheckLimit is seed 003's model exactly: the window is [beginTime,
// beginTime+duration), and a zero beginTime means now. If the stored window
// is current and has counted limit events it returns false; otherwise it
// counts the event (a stale window restarts at beginTime) and returns true.
// Pass today's midnight as beginTime for a natural-day limit. It shares its
// counter with Allow for the same useType and id. Unlike the seed, limit 0
// allows nothing.
func (l *Limiter) CheckLimit(ctx context.Context, useType UseType, id string, limit int64, duration time.Duration, beginTime time.Time) (bool, error) {
	if err := validateKey(useType, id); err != nil {
		return false, wrap(OpAllow, useType, err)
	}
	if limit < 0 || limit > MaxLimit {
		return false, wrap(OpAllow, useType, invalidf("limit", "must be 0 to 2^53, got %d", limit))
	}
	if duration < time.Microsecond || duration > MaxDuration {
		return false, wrap(OpAllow, useType, invalidf("duration", "must be 1µs to 100 years, got %v", duration))
	}
	now, err := l.clockFor(ctx)
	if err != nil {
		return false, wrap(OpAllow, useType, err)
	}
	begin := now
	if !beginTime.IsZero() {
		begin = beginTime.Truncate(time.Microsecond)
	}
	c := callPool.Get().(*call)
	defer callPool.Put(c)
	c.checks[0] = Check{UseType: useType, Limit: limit, Begin: begin, End: begin.Add(truncMicro(duration))}
	c.req = Request{Op: OpAllow, ID: id, Now: now, N: 1, Checks: c.checks[:]}
	if err := l.do(ctx, OpAllow, c.reqs[:]); err != nil {
		return false, wrap(OpAllow, useType, err)
	}
	return c.checks[0].State.Allowed, nil
}

// Now reads the Limiter's clock (corrected to the store's with
// WithStoreClock), to the microsecond as the stores keep time: what a
// Result's ResetAt and BlockedUntil are relative to.
func (l *Limiter) Now() time.Time { return l.clock() }

// check turns a validated rule into the explicit form a Store needs.
func check(r Rule, now time.Time) Check {
	c := Check{UseType: r.UseType, Limit: r.Limit, Block: truncMicro(r.Block)}
	c.Begin, c.End = bounds(now, r.Window)
	if r.Window.kind == kindSliding {
		c.Span = truncMicro(r.Window.d)
	}
	return c
}

// need reports how long until a check with this state has room for n, or
// never when no wait helps. It is 0 when the request was allowed.
func need(c *Check, now time.Time, n int64) (wait time.Duration, never bool) {
	s := &c.State
	if s.Allowed {
		return 0, false
	}
	if !s.BlockedUntil.IsZero() {
		wait = s.BlockedUntil.Sub(now)
	}
	if n <= c.Limit-s.Used { // not s.Used+n: that may overflow
		return wait, false
	}
	var room time.Time
	switch {
	case n > c.Limit:
		return -1, true
	case c.Span > 0:
		if s.FreeAt.IsZero() {
			return -1, true
		}
		room = s.FreeAt.Add(c.Span)
	case s.End.IsZero():
		return -1, true
	default:
		room = s.End
	}
	return max(wait, room.Sub(now)), false
}

func result(c *Check, now time.Time, retry time.Duration) Result {
	s := &c.State
	r := Result{
		Allowed:      s.Allowed,
		Limit:        c.Limit,
		Used:         s.Used,
		Remaining:    max(0, c.Limit-s.Used),
		ResetAt:      s.End,
		BlockedUntil: s.BlockedUntil,
	}
	if c.Span > 0 {
		r.ResetAt = now
		if s.Used > 0 {
			r.ResetAt = s.Begin.Add(c.Span)
		}
	}
	if !r.Allowed {
		r.RetryAfter = retry
	}
	return r
}

// Validate reports why r cannot be used, as every Limiter method would: an
// error wrapping ErrInvalid that names the field, or nil. Configuration
// loaders call it so a bad rule fails at load time, not on every check.
func (r Rule) Validate() error {
	if err := validateName(string(r.UseType)); err != "" {
		return invalidf("UseType", "%s", err)
	}
	return r.validateLimits()
}

func validate(r Rule, id string, n int64) error {
	if err := validateKey(r.UseType, id); err != nil {
		return err
	}
	if err := r.validateLimits(); err != nil {
		return err
	}
	if n < 1 || n > MaxLimit {
		return invalidf("n", "must be 1 to 2^53, got %d", n)
	}
	return nil
}

func (r Rule) validateLimits() error {
	if r.Limit < 0 || r.Limit > MaxLimit {
		return invalidf("Rule.Limit", "must be 0 to 2^53, got %d", r.Limit)
	}
	if err := r.Window.validate(); err != nil {
		return err
	}
	if r.Window.kind == kindSliding && r.Limit > MaxSlidingLimit {
		return invalidf("Rule.Limit", "a Sliding window logs every event: at most %d, got %d (use Fixed or Rolling for more)", MaxSlidingLimit, r.Limit)
	}
	if r.Block < 0 || r.Block > MaxDuration {
		return invalidf("Rule.Block", "must be 0 to 100 years, got %v", r.Block)
	}
	return nil
}

// ValidateID reports whether id is usable as an id: non-empty, at most
// MaxIDLen bytes, valid UTF-8, no NUL byte. The error wraps ErrInvalid and
// names the field "id". Handlers use it to answer 400 before any check.
func ValidateID(id string) error {
	if err := validateName(id); err != "" {
		return invalidf("id", "%s", err)
	}
	return nil
}

func validateKey(ut UseType, id string) error {
	if err := validateName(string(ut)); err != "" {
		return invalidf("UseType", "%s", err)
	}
	return ValidateID(id)
}

func validateName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxIDLen:
		return fmt.Sprintf("is %d bytes, more than %d", len(s), MaxIDLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return "holds a NUL byte"
		}
	}
	return ""
}

func wrap(op Op, ut UseType, err error) error {
	if ut == "" {
		return fmt.Errorf("countlimit: %s: %w", op, err)
	}
	return fmt.Errorf("countlimit: %s %q: %w", op, ut, err)
}
