package httplimit

import (
	"context"
	"net/http"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
)

// Concurrency returns middleware that holds a slot of rule, whose window must
// be [countlimit.Concurrent], keyed by key, for as long as the next handler
// runs: at most rule.Limit requests of one key are in flight at once. A
// request that finds no free slot is denied as [Middleware] denies it (429
// by default, with Retry-After the wait until the earliest held slot
// expires); errors and [FailOpen] are handled as there too.
//
// The slot is released when the handler returns, and also when it panics
// (the panic goes on up). The release does not depend on the request's
// context, which ends when the client goes away; if it fails, the slot
// frees itself ttl after it was taken. Choose a ttl longer than the longest
// request: a request that outlives it loses its slot to the next one.
// Concurrency panics if l or key is nil or rule's window is not Concurrent.
func Concurrency(l *countlimit.Limiter, key KeyFunc, rule countlimit.Rule, opts ...Option) func(http.Handler) http.Handler {
	if l == nil || key == nil {
		panic("httplimit: Concurrency called with a nil Limiter or KeyFunc")
	}
	if !expose.WindowOf(rule.Window).Concurrent {
		panic("httplimit: Concurrency needs a rule with a Concurrent window, got " + rule.Window.String())
	}
	c := newConfig(opts)
	rules := []countlimit.Rule{rule}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			lease, res, err := l.Acquire(r.Context(), rule, key(r))
			if err != nil {
				c.failed(w, r, err, next)
				return
			}
			results := []countlimit.Result{res}
			c.setHeaders(w.Header(), expose.Now(l), rules, results)
			if !res.Allowed {
				c.denied(w, r, results)
				return
			}
			defer lease.Release(context.WithoutCancel(r.Context()))
			next.ServeHTTP(w, r)
		})
	}
}
