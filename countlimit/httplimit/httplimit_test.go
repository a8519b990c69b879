package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/httplimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

// t0 is a Monday, 09:00 UTC: 15 hours before the natural day ends.
var t0 = time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC)

// newLimiter returns a Limiter over a fresh memstore, on clock.
func newLimiter(t *testing.T, clock *storetest.Clock) *countlimit.Limiter {
	t.Helper()
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	return countlimit.New(s, countlimit.WithClock(clock.Now))
}

// downStore is a store that cannot be reached.
type downStore struct{}

func (downStore) Do(context.Context, *driver.Request) error {
	return driver.Unavailable(errors.New("down"))
}

// served answers "ok", so a test can tell the next handler ran.
var served = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })

// req is one request: its peer and headers.
type req struct {
	remote string
	header map[string]string
}

// want is a response; an empty header value means the header is absent.
type want struct {
	status                        int
	retryAfter, policy, rateLimit string
}

func do(h http.Handler, q req) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	if q.remote != "" {
		r.RemoteAddr = q.remote
	}
	for k, v := range q.header {
		r.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func check(t *testing.T, step string, rec *httptest.ResponseRecorder, w want) {
	t.Helper()
	if rec.Code != w.status {
		t.Errorf("%s: status = %d, want %d", step, rec.Code, w.status)
	}
	if body := rec.Body.String(); (body == "ok") != (w.status == http.StatusOK) {
		t.Errorf("%s: body = %q: next handler ran = %v, want %v", step, body, body == "ok", w.status == http.StatusOK)
	}
	for _, h := range []struct{ name, want string }{
		{"Retry-After", w.retryAfter},
		{"RateLimit-Policy", w.policy},
		{"RateLimit", w.rateLimit},
	} {
		// Joined as HTTP joins repeated fields, so a List split over lines compares equal.
		if got := strings.Join(rec.Header().Values(h.name), ", "); got != h.want {
			t.Errorf("%s: %s = %q, want %q", step, h.name, got, h.want)
		}
	}
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	type step struct {
		at time.Duration // after t0
		want
	}
	sec := time.Second
	tests := []struct {
		name  string
		rules []countlimit.Rule
		steps []step
	}{
		{
			name:  "fixed window",
			rules: []countlimit.Rule{{UseType: "api", Limit: 2, Window: countlimit.Fixed(time.Minute)}},
			steps: []step{
				{20 * sec, want{200, "", `"api";q=2;w=60`, `"api";r=1;t=40`}},
				{20 * sec, want{200, "", `"api";q=2;w=60`, `"api";r=0;t=40`}},
				{50 * sec, want{429, "10", `"api";q=2;w=60`, `"api";r=0;t=10`}},
				{60 * sec, want{200, "", `"api";q=2;w=60`, `"api";r=1;t=60`}},
			},
		},
		{
			name:  "seconds round up",
			rules: []countlimit.Rule{{UseType: "api", Limit: 1, Window: countlimit.Fixed(time.Minute)}},
			steps: []step{
				{200 * time.Millisecond, want{200, "", `"api";q=1;w=60`, `"api";r=0;t=60`}},
				{59500 * time.Millisecond, want{429, "1", `"api";q=1;w=60`, `"api";r=0;t=1`}},
				{59999 * time.Millisecond, want{429, "1", `"api";q=1;w=60`, `"api";r=0;t=1`}},
			},
		},
		{
			name:  "penalty box outlives the window",
			rules: []countlimit.Rule{{UseType: "login", Limit: 1, Window: countlimit.Fixed(time.Minute), Block: 10 * time.Minute}},
			steps: []step{
				{0, want{200, "", `"login";q=1;w=60`, `"login";r=0;t=60`}},
				{1 * sec, want{429, "600", `"login";q=1;w=60`, `"login";r=0;t=600`}},
				// A fresh window, but the penalty runs to 09:10:01: r is 0, t its end.
				{150 * sec, want{429, "451", `"login";q=1;w=60`, `"login";r=0;t=451`}},
				{601 * sec, want{200, "", `"login";q=1;w=60`, `"login";r=0;t=59`}},
			},
		},
		{
			name:  "lifetime: no w, no t, no Retry-After",
			rules: []countlimit.Rule{{UseType: "trial", Limit: 1, Window: countlimit.Lifetime()}},
			steps: []step{
				{0, want{200, "", `"trial";q=1`, `"trial";r=0`}},
				{sec, want{429, "", `"trial";q=1`, `"trial";r=0`}},
			},
		},
		{
			name:  "sliding",
			rules: []countlimit.Rule{{UseType: "search", Limit: 2, Window: countlimit.Sliding(time.Minute)}},
			steps: []step{
				{0, want{200, "", `"search";q=2;w=60`, `"search";r=1;t=60`}},
				{30 * sec, want{200, "", `"search";q=2;w=60`, `"search";r=0;t=30`}},
				{40 * sec, want{429, "20", `"search";q=2;w=60`, `"search";r=0;t=20`}},
				{60 * sec, want{200, "", `"search";q=2;w=60`, `"search";r=0;t=30`}},
			},
		},
		{
			name:  "calendar day: no w",
			rules: []countlimit.Rule{{UseType: "export", Limit: 1, Window: countlimit.Calendar(countlimit.Day, time.UTC)}},
			steps: []step{
				{0, want{200, "", `"export";q=1`, `"export";r=0;t=54000`}},
				{sec, want{429, "53999", `"export";q=1`, `"export";r=0;t=53999`}},
			},
		},
		{
			name: "two rules, all or nothing",
			rules: []countlimit.Rule{
				{UseType: "burst", Limit: 2, Window: countlimit.Fixed(time.Minute)},
				{UseType: "daily", Limit: 3, Window: countlimit.Calendar(countlimit.Day, time.UTC)},
			},
			steps: []step{
				{0, want{200, "", `"burst";q=2;w=60, "daily";q=3`, `"burst";r=1;t=60, "daily";r=2;t=54000`}},
				{0, want{200, "", `"burst";q=2;w=60, "daily";q=3`, `"burst";r=0;t=60, "daily";r=1;t=54000`}},
				// burst denies, so daily counts nothing either.
				{10 * sec, want{429, "50", `"burst";q=2;w=60, "daily";q=3`, `"burst";r=0;t=50, "daily";r=1;t=53990`}},
				{60 * sec, want{200, "", `"burst";q=2;w=60, "daily";q=3`, `"burst";r=1;t=60, "daily";r=0;t=53940`}},
				// daily denies: wait for midnight.
				{70 * sec, want{429, "53930", `"burst";q=2;w=60, "daily";q=3`, `"burst";r=1;t=50, "daily";r=0;t=53930`}},
			},
		},
		{
			// 10 a second with bursts of 3: a quota of 3 that refills in
			// 300ms, stated as 1s; r is what fits at once, t the wait
			// until all of it does, Retry-After the wait for one.
			name:  "smooth",
			rules: []countlimit.Rule{{UseType: "api", Limit: 10, Window: countlimit.Smooth(time.Second, 3)}},
			steps: []step{
				{0, want{200, "", `"api";q=3;w=1`, `"api";r=2;t=1`}},
				{0, want{200, "", `"api";q=3;w=1`, `"api";r=1;t=1`}},
				{0, want{200, "", `"api";q=3;w=1`, `"api";r=0;t=1`}},
				{0, want{429, "1", `"api";q=3;w=1`, `"api";r=0;t=1`}},
				{250 * time.Millisecond, want{200, "", `"api";q=3;w=1`, `"api";r=1;t=1`}},
				{5 * sec, want{200, "", `"api";q=3;w=1`, `"api";r=2;t=1`}},
			},
		},
		{
			name:  "smooth, slow, with a penalty",
			rules: []countlimit.Rule{{UseType: "pw", Limit: 1, Window: countlimit.Smooth(time.Minute, 2), Block: 10 * time.Minute}},
			steps: []step{
				{0, want{200, "", `"pw";q=2;w=120`, `"pw";r=1;t=60`}},
				{30 * sec, want{200, "", `"pw";q=2;w=120`, `"pw";r=0;t=90`}},
				{40 * sec, want{429, "600", `"pw";q=2;w=120`, `"pw";r=0;t=600`}},
			},
		},
		{
			name:  "names are Structured Field Strings",
			rules: []countlimit.Rule{{UseType: `sms "code"\短信`, Limit: 1, Window: countlimit.Fixed(time.Minute)}},
			steps: []step{
				{0, want{200, "", `"sms \"code\"\\__";q=1;w=60`, `"sms \"code\"\\__";r=0;t=60`}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(t0)
			h := httplimit.Middleware(newLimiter(t, clock), httplimit.ClientIP(), httplimit.Rules(tc.rules...))(served)
			for i, s := range tc.steps {
				clock.Set(t0.Add(s.at))
				check(t, fmt.Sprintf("step %d (t0+%v)", i, s.at), do(h, req{}), s.want)
			}
		})
	}
}

// TestPolicyWindow pins w for every kind of window; it is read from
// expose.WindowOf(w).Duration, so this breaks if what that reports changes.
func TestPolicyWindow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		window countlimit.Window
		want   string
	}{
		{countlimit.Fixed(time.Minute), `"w";q=5;w=60`},
		{countlimit.Fixed(1500 * time.Millisecond), `"w";q=5;w=2`},
		{countlimit.Rolling(90 * time.Second), `"w";q=5;w=90`},
		{countlimit.Sliding(time.Hour), `"w";q=5;w=3600`},
		{countlimit.Rolling(36 * time.Hour), `"w";q=5;w=129600`},
		{countlimit.Calendar(countlimit.Month, time.UTC), `"w";q=5`},
		{countlimit.Lifetime(), `"w";q=5`},
		{countlimit.Smooth(time.Second, 20), `"w";q=20;w=4`},
		{countlimit.Smooth(time.Hour, 1), `"w";q=1;w=720`},
		{countlimit.Smooth(time.Second, 1), `"w";q=1;w=1`},
	}
	for _, tc := range tests {
		t.Run(tc.window.String(), func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(t0)
			rule := countlimit.Rule{UseType: "w", Limit: 5, Window: tc.window}
			h := httplimit.Middleware(newLimiter(t, clock), httplimit.ClientIP(), httplimit.Rules(rule))(served)
			rec := do(h, req{})
			if got := rec.Header().Get("RateLimit-Policy"); got != tc.want {
				t.Errorf("RateLimit-Policy = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTiers(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(t0)
	anonymous := []countlimit.Rule{{UseType: "api", Limit: 1, Window: countlimit.Fixed(time.Minute)}}
	registered := []countlimit.Rule{{UseType: "api", Limit: 3, Window: countlimit.Fixed(time.Minute)}}
	ip := httplimit.ClientIP()
	key := func(r *http.Request) string {
		if u := r.Header.Get("X-User"); u != "" {
			return "user:" + u
		}
		return "ip:" + ip(r)
	}
	tier := func(r *http.Request) []countlimit.Rule {
		if r.Header.Get("X-User") != "" {
			return registered
		}
		return anonymous
	}
	names := map[int64]string{1: "anonymous", 3: "registered"}
	h := httplimit.Middleware(newLimiter(t, clock), key, tier,
		httplimit.WithPolicyName(func(r countlimit.Rule) string { return names[r.Limit] }))(served)

	alice := map[string]string{"X-User": "alice"}
	steps := []struct {
		req
		want
	}{
		{req{}, want{200, "", `"anonymous";q=1;w=60`, `"anonymous";r=0;t=60`}},
		{req{}, want{429, "60", `"anonymous";q=1;w=60`, `"anonymous";r=0;t=60`}},
		{req{remote: "192.0.2.2:1"}, want{200, "", `"anonymous";q=1;w=60`, `"anonymous";r=0;t=60`}},
		{req{header: alice}, want{200, "", `"registered";q=3;w=60`, `"registered";r=2;t=60`}},
		{req{header: alice}, want{200, "", `"registered";q=3;w=60`, `"registered";r=1;t=60`}},
		{req{header: alice}, want{200, "", `"registered";q=3;w=60`, `"registered";r=0;t=60`}},
		{req{header: alice}, want{429, "60", `"registered";q=3;w=60`, `"registered";r=0;t=60`}},
	}
	for i, s := range steps {
		check(t, fmt.Sprintf("step %d (%v)", i, s.req), do(h, s.req), s.want)
	}
}

func TestStackedMiddlewareListsBothPolicies(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(t0)
	l := newLimiter(t, clock)
	perIP := httplimit.Middleware(l, httplimit.ClientIP(),
		httplimit.Rules(countlimit.Rule{UseType: "ip", Limit: 5, Window: countlimit.Fixed(time.Minute)}))
	perUser := httplimit.Middleware(l, httplimit.Header("X-User"),
		httplimit.Rules(countlimit.Rule{UseType: "user", Limit: 1, Window: countlimit.Fixed(time.Hour)}))
	h := perIP(perUser(served))
	u := req{header: map[string]string{"X-User": "bob"}}
	check(t, "first", do(h, u), want{200, "", `"ip";q=5;w=60, "user";q=1;w=3600`, `"ip";r=4;t=60, "user";r=0;t=3600`})
	check(t, "second", do(h, u), want{429, "3600", `"ip";q=5;w=60, "user";q=1;w=3600`, `"ip";r=3;t=60, "user";r=0;t=3600`})
}

func TestInvalidKey(t *testing.T) {
	t.Parallel()
	rules := httplimit.Rules(countlimit.Rule{UseType: "api", Limit: 5, Window: countlimit.Fixed(time.Minute)})
	tests := []struct {
		name string
		key  httplimit.KeyFunc
		req  req
	}{
		{"header missing", httplimit.Header("X-API-Key"), req{}},
		{"header blank", httplimit.Header("X-API-Key"), req{header: map[string]string{"X-API-Key": "   "}}},
		{"header over 512 bytes", httplimit.Header("X-API-Key"), req{header: map[string]string{"X-API-Key": strings.Repeat("k", 513)}}},
		{"header not UTF-8", httplimit.Header("X-API-Key"), req{header: map[string]string{"X-API-Key": "k\xff"}}},
		{"RemoteAddr not an IP", httplimit.ClientIP(), req{remote: "@"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(t0)
			l := newLimiter(t, clock)
			h := httplimit.Middleware(l, tc.key, rules)(served)
			check(t, "default", do(h, tc.req), want{status: 400})

			var got error
			h = httplimit.Middleware(l, tc.key, rules, httplimit.FailOpen(nil),
				httplimit.OnError(func(w http.ResponseWriter, _ *http.Request, err error) {
					got = err
					w.WriteHeader(http.StatusUnauthorized)
				}))(served)
			check(t, "OnError under FailOpen", do(h, tc.req), want{status: 401})
			if !errors.Is(got, countlimit.ErrInvalid) {
				t.Errorf("OnError got %v, want ErrInvalid", got)
			}
		})
	}
}

func TestStoreDown(t *testing.T) {
	t.Parallel()
	rules := httplimit.Rules(countlimit.Rule{UseType: "api", Limit: 5, Window: countlimit.Fixed(time.Minute)})
	tests := []struct {
		name string
		opt  func(got *error) httplimit.Option
		want want
		mark string // X-RateLimit-Unavailable
		seen bool   // the handler opt installs sees the error
	}{
		{"fail closed by default", nil, want{status: 503}, "", false},
		{"fail closed, OnError", func(got *error) httplimit.Option {
			return httplimit.OnError(func(w http.ResponseWriter, _ *http.Request, err error) {
				*got = err
				w.WriteHeader(http.StatusInternalServerError)
			})
		}, want{status: 500}, "", true},
		{"fail open", func(*error) httplimit.Option { return httplimit.FailOpen(nil) }, want{status: 200}, "", false},
		{"fail open, marked", func(got *error) httplimit.Option {
			return httplimit.FailOpen(func(w http.ResponseWriter, _ *http.Request, err error) {
				*got = err
				w.Header().Set("X-RateLimit-Unavailable", "1")
			})
		}, want{status: 200}, "1", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var opts []httplimit.Option
			var got error
			if tc.opt != nil {
				opts = append(opts, tc.opt(&got))
			}
			h := httplimit.Middleware(countlimit.New(downStore{}), httplimit.ClientIP(), rules, opts...)(served)
			rec := do(h, req{})
			check(t, tc.name, rec, tc.want)
			if mark := rec.Header().Get("X-RateLimit-Unavailable"); mark != tc.mark {
				t.Errorf("X-RateLimit-Unavailable = %q, want %q", mark, tc.mark)
			}
			if tc.seen && !errors.Is(got, countlimit.ErrUnavailable) {
				t.Errorf("handler got %v, want ErrUnavailable", got)
			}
		})
	}
}

func TestOnDenied(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(t0)
	rule := countlimit.Rule{UseType: "api", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	var got []countlimit.Result
	h := httplimit.Middleware(newLimiter(t, clock), httplimit.ClientIP(), httplimit.Rules(rule),
		httplimit.OnDenied(func(w http.ResponseWriter, _ *http.Request, res []countlimit.Result) {
			got = res
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, `{"retry_after":%q}`, w.Header().Get("Retry-After"))
		}))(served)
	do(h, req{})
	rec := do(h, req{})
	check(t, "denied", rec, want{429, "60", `"api";q=1;w=60`, `"api";r=0;t=60`})
	if body := rec.Body.String(); body != `{"retry_after":"60"}` {
		t.Errorf("body = %s, want the handler's, with Retry-After already set", body)
	}
	if len(got) != 1 || got[0].Allowed || got[0].RetryAfter != time.Minute {
		t.Errorf("OnDenied got %+v, want one denied Result with RetryAfter 1m", got)
	}
}

func TestConcurrentExactlyLimit(t *testing.T) {
	t.Parallel()
	const limit, callers = 50, 400
	clock := storetest.NewClock(t0)
	rule := countlimit.Rule{UseType: "api", Limit: limit, Window: countlimit.Fixed(time.Minute)}
	h := httplimit.Middleware(newLimiter(t, clock), httplimit.ClientIP(), httplimit.Rules(rule))(served)

	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			rec := do(h, req{})
			mu.Lock()
			codes[rec.Code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[200] != limit || codes[429] != callers-limit {
		t.Errorf("statuses = %v, want %d × 200 and %d × 429", codes, limit, callers-limit)
	}
}
