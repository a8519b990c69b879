package httplimit

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
)

// RuleFunc returns the rules one request is checked against. One rule is
// checked with [countlimit.Limiter.Allow]; several are checked
// all-or-nothing with [countlimit.Limiter.AllowAll], so a request denied by
// one counts for none. Returning a different rule per request picks a tier:
// the same UseType with 100 a minute for registered users and 10 for
// anonymous ones. The middleware only reads the slice, so it may be shared.
type RuleFunc func(*http.Request) []countlimit.Rule

// Rules returns a RuleFunc that checks every request against the same rules.
func Rules(rules ...countlimit.Rule) RuleFunc {
	rules = slices.Clone(rules)
	return func(*http.Request) []countlimit.Rule { return rules }
}

// DeniedHandler answers a denied request. res holds one Result per rule, in
// the RuleFunc's order. Retry-After and the RateLimit fields are already set
// on w.Header().
type DeniedHandler func(w http.ResponseWriter, r *http.Request, res []countlimit.Result)

// ErrorHandler handles a request whose check failed with err, which wraps
// countlimit.ErrInvalid or countlimit.ErrUnavailable.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

// Option configures [Middleware].
type Option func(*config)

type config struct {
	name     func(countlimit.Rule) string
	denied   DeniedHandler
	onError  ErrorHandler
	failOpen bool
	observe  ErrorHandler
}

// WithPolicyName sets how a rule is named in the RateLimit fields (default:
// its UseType, which clients then see). Characters a Structured Field String
// cannot hold, anything outside printable ASCII, become '_'.
func WithPolicyName(name func(countlimit.Rule) string) Option {
	return func(c *config) {
		if name != nil {
			c.name = name
		}
	}
}

// OnDenied sets the handler that answers denied requests (default: 429 Too
// Many Requests with a plain-text body).
func OnDenied(h DeniedHandler) Option {
	return func(c *config) {
		if h != nil {
			c.denied = h
		}
	}
}

// OnError sets the handler for failed checks (default: 400 Bad Request for
// countlimit.ErrInvalid, 503 Service Unavailable for
// countlimit.ErrUnavailable). Under [FailOpen] it sees only ErrInvalid.
func OnError(h ErrorHandler) Option {
	return func(c *config) {
		if h != nil {
			c.onError = h
		}
	}
}

// FailOpen serves requests unlimited while the store fails
// (countlimit.ErrUnavailable), trading the limit for availability. The
// default is to fail closed with 503. A failure reaches the middleware only
// as fast as the Limiter gives it up: give the Limiter
// countlimit.WithStoreTimeout and countlimit.WithCircuitBreaker so a stalled
// or dead store answers in milliseconds, or countlimit.WithFallback to keep
// limiting per process instead of opening. observe, when not nil, is called
// before the next handler, to log the error or mark the response with a
// header; it must not write the body.
func FailOpen(observe ErrorHandler) Option {
	return func(c *config) {
		c.failOpen = true
		c.observe = observe
	}
}

// Middleware returns middleware that checks each request, keyed by key,
// against the rules rules picks, and lets it through to the next handler
// only when they allow it. Its handlers are safe for concurrent use.
// Middleware panics if l, key or rules is nil.
func Middleware(l *countlimit.Limiter, key KeyFunc, rules RuleFunc, opts ...Option) func(http.Handler) http.Handler {
	if l == nil || key == nil || rules == nil {
		panic("httplimit: Middleware called with a nil Limiter, KeyFunc or RuleFunc")
	}
	c := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rs := rules(r)
			res, err := check(r.Context(), l, key(r), rs)
			if err != nil {
				c.failed(w, r, err, next)
				return
			}
			c.setHeaders(w.Header(), expose.Now(l), rs, res)
			if !res[0].Allowed {
				c.denied(w, r, res)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// failed answers a request whose check failed with err: through next
// under FailOpen when the store failed, else with the error handler.
func (c *config) failed(w http.ResponseWriter, r *http.Request, err error, next http.Handler) {
	if c.failOpen && errors.Is(err, countlimit.ErrUnavailable) {
		if c.observe != nil {
			c.observe(w, r, err)
		}
		next.ServeHTTP(w, r)
		return
	}
	c.onError(w, r, err)
}

func newConfig(opts []Option) *config {
	c := &config{
		name:    func(r countlimit.Rule) string { return string(r.UseType) },
		denied:  tooManyRequests,
		onError: answerError,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

func check(ctx context.Context, l *countlimit.Limiter, id string, rules []countlimit.Rule) ([]countlimit.Result, error) {
	if len(rules) == 1 {
		// Allow is pooled and allocation-free; AllowAll is not.
		res, err := l.Allow(ctx, rules[0], id)
		if err != nil {
			return nil, err
		}
		return []countlimit.Result{res}, nil
	}
	return l.AllowAll(ctx, id, rules...)
}

func tooManyRequests(w http.ResponseWriter, _ *http.Request, _ []countlimit.Result) {
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

// answerError keeps err's text out of the response: it may name the store.
func answerError(w http.ResponseWriter, _ *http.Request, err error) {
	code := http.StatusBadRequest
	if errors.Is(err, countlimit.ErrUnavailable) {
		code = http.StatusServiceUnavailable
	}
	http.Error(w, http.StatusText(code), code)
}

func (c *config) setHeaders(h http.Header, now time.Time, rules []countlimit.Rule, res []countlimit.Result) {
	var policy, state []byte
	for i, rule := range rules {
		if i > 0 {
			policy = append(policy, ", "...)
			state = append(state, ", "...)
		}
		name := sfString(c.name(rule))
		policy = append(policy, name...)
		q, w, ok := rule.Limit, int64(0), false
		if expose.WindowOf(rule.Window).Smooth {
			q, w, ok = smoothPolicy(rule)
		} else {
			w, ok = windowSeconds(rule.Window)
		}
		policy = append(policy, ";q="...)
		policy = strconv.AppendInt(policy, q, 10)
		if ok {
			policy = append(policy, ";w="...)
			policy = strconv.AppendInt(policy, w, 10)
		}

		r := res[i]
		remaining, reset := r.Remaining, r.ResetAt
		if !r.BlockedUntil.IsZero() {
			remaining = 0
			if r.BlockedUntil.After(reset) {
				reset = r.BlockedUntil
			}
		}
		state = append(state, name...)
		state = append(state, ";r="...)
		state = strconv.AppendInt(state, remaining, 10)
		if !reset.IsZero() {
			state = append(state, ";t="...)
			state = strconv.AppendInt(state, seconds(reset.Sub(now)), 10)
		}
	}
	h.Add("RateLimit-Policy", string(policy))
	h.Add("RateLimit", string(state))
	// AllowAll gives every Result the wait for the whole call.
	if retry := res[0].RetryAfter; !res[0].Allowed && retry >= 0 {
		h.Set("Retry-After", strconv.FormatInt(max(1, seconds(retry)), 10))
	}
}

// seconds rounds d up to whole seconds, so a client that waits that long is
// never early; a negative d is 0.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// windowSeconds returns the length of a Rolling, Fixed or Sliding window.
// A Concurrent window has none: its quota is of requests in flight.
func windowSeconds(w countlimit.Window) (int64, bool) {
	d := expose.WindowOf(w).Duration
	return seconds(d), d > 0 && !expose.WindowOf(w).Concurrent
}

// smoothPolicy states a Smooth rule as a quota that refills over a
// window: its burst, over the time a whole burst takes to drain (rounded
// up to seconds), so that the RateLimit field's r (what fits at once,
// Result.Remaining) is at most q and its t (until the id is drained,
// Result.ResetAt) at most w, and q/w is the rule's rate, or less where
// w rounds up. A rule of Limit 0 has quota 0 and no window.
func smoothPolicy(rule countlimit.Rule) (q, w int64, ok bool) {
	if rule.Limit == 0 {
		return 0, 0, false
	}
	b := expose.WindowOf(rule.Window).Burst
	iv := expose.Interval(rule.Window, rule.Limit)
	if b > int64(expose.MaxDuration/iv) { // an invalid rule: the check fails with ErrInvalid
		return b, 0, false
	}
	return b, seconds(time.Duration(b) * iv), true
}

// sfString quotes s as a Structured Field String (RFC 9651, section
// 3.3.3), which holds printable ASCII only.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
