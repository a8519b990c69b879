package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/httplimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// clockAt returns a stubbed clock for deterministic examples.
func clockAt(t time.Time) func() time.Time { return func() time.Time { return t } }

// Two requests a minute per client IP; the third is answered 429 with
// Retry-After and the RateLimit fields.
func ExampleMiddleware() {
	store := memstore.New()
	defer store.Close()
	now := clockAt(time.Date(2026, 5, 11, 9, 0, 45, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))

	perMinute := countlimit.Rule{UseType: "api", Limit: 2, Window: countlimit.Fixed(time.Minute)}
	limit := httplimit.Middleware(limiter, httplimit.ClientIP(), httplimit.Rules(perMinute))
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	h := limit(hello)

	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Printf("%d Retry-After=%q RateLimit-Policy=%s RateLimit=%s\n", rec.Code,
			rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200 Retry-After="" RateLimit-Policy="api";q=2;w=60 RateLimit="api";r=1;t=15
	// 200 Retry-After="" RateLimit-Policy="api";q=2;w=60 RateLimit="api";r=0;t=15
	// 429 Retry-After="15" RateLimit-Policy="api";q=2;w=60 RateLimit="api";r=0;t=15
}

// Registered users get 100 requests a minute, anonymous clients 10, counted
// by one UseType: the RuleFunc picks the tier per request.
func ExampleMiddleware_tiers() {
	store := memstore.New()
	defer store.Close()
	now := clockAt(time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))

	anonymous := []countlimit.Rule{{UseType: "api", Limit: 10, Window: countlimit.Fixed(time.Minute)}}
	registered := []countlimit.Rule{{UseType: "api", Limit: 100, Window: countlimit.Fixed(time.Minute)}}
	user := func(r *http.Request) string { return r.Header.Get("X-User") } // set by your authentication
	ip := httplimit.ClientIP()
	key := func(r *http.Request) string {
		if u := user(r); u != "" {
			return "user:" + u
		}
		return "ip:" + ip(r)
	}
	tier := func(r *http.Request) []countlimit.Rule {
		if user(r) != "" {
			return registered
		}
		return anonymous
	}
	name := func(r countlimit.Rule) string {
		if r.Limit == 100 {
			return "registered"
		}
		return "anonymous"
	}
	h := httplimit.Middleware(limiter, key, tier, httplimit.WithPolicyName(name))(http.NotFoundHandler())

	for _, u := range []string{"", "alice"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-User", u)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		fmt.Printf("user %q: %s\n", u, rec.Header().Get("RateLimit"))
	}
	// Output:
	// user "": "anonymous";r=9;t=60
	// user "alice": "registered";r=99;t=60
}

// Behind a load balancer in 10.0.0.0/8, the client is the rightmost
// X-Forwarded-For address that is not a trusted proxy. From any other peer
// the header is ignored, so clients cannot forge their way to a fresh limit.
func ExampleClientIP() {
	key := httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))

	viaProxy := httptest.NewRequest(http.MethodGet, "/", nil)
	viaProxy.RemoteAddr = "10.0.0.5:41000"
	viaProxy.Header.Set("X-Forwarded-For", "198.51.100.66, 203.0.113.7, 10.0.0.9")
	fmt.Println("via the proxy:", key(viaProxy))

	direct := httptest.NewRequest(http.MethodGet, "/", nil)
	direct.RemoteAddr = "[2001:db8::1]:52000"
	direct.Header.Set("X-Forwarded-For", "203.0.113.7")
	fmt.Println("direct, forged header:", key(direct))
	// Output:
	// via the proxy: 203.0.113.7
	// direct, forged header: 2001:db8::/64
}

// unreachable is a store whose server is down.
type unreachable struct{}

func (unreachable) Do(context.Context, *driver.Request) error {
	return driver.Unavailable(errors.New("connection refused"))
}

// While the store is down, serve requests unlimited rather than fail them
// with 503, and say so in a header.
func ExampleFailOpen() {
	limiter := countlimit.New(unreachable{})
	rule := countlimit.Rule{UseType: "api", Limit: 10, Window: countlimit.Fixed(time.Minute)}
	h := httplimit.Middleware(limiter, httplimit.ClientIP(), httplimit.Rules(rule),
		httplimit.FailOpen(func(w http.ResponseWriter, r *http.Request, err error) {
			log.Printf("rate limit skipped for %s: %v", r.URL.Path, err)
			w.Header().Set("X-RateLimit-Skipped", "store unavailable")
		}))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") }))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(rec.Code, rec.Header().Get("X-RateLimit-Skipped"), rec.Body.String())
	// Output:
	// 200 store unavailable hello
}
