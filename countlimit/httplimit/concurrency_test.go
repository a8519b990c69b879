package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/httplimit"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

var exports = countlimit.Rule{UseType: "export.running", Limit: 2, Window: countlimit.Concurrent(10 * time.Minute)}

// held reports how many slots of exports the test client holds.
func held(t *testing.T, l *countlimit.Limiter) int64 {
	t.Helper()
	r, err := l.Peek(context.Background(), exports, "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	return r.Used
}

// TestConcurrencyHoldsASlotPerRequest: two requests in flight hold both
// slots, a third is denied until one returns.
func TestConcurrencyHoldsASlotPerRequest(t *testing.T) {
	l := newLimiter(t, storetest.NewClock(t0))
	release := make(chan struct{})
	entered := make(chan struct{})
	// Requests with X-Hold wait in the handler until told to go.
	h := httplimit.Concurrency(l, httplimit.ClientIP(), exports)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			entered <- struct{}{}
			<-release
		}
	}))
	hold := req{header: map[string]string{"X-Hold": "1"}}
	codes := make(chan int, 2)
	for range 2 {
		go func() { codes <- do(h, hold).Code }()
		<-entered
	}
	if n := held(t, l); n != 2 {
		t.Fatalf("%d slots held with 2 requests in flight, want 2", n)
	}
	check(t, "third request", do(h, req{}), want{status: http.StatusTooManyRequests, retryAfter: "600",
		policy: `"export.running";q=2`, rateLimit: `"export.running";r=0;t=600`})
	release <- struct{}{}
	if c := <-codes; c != http.StatusOK {
		t.Errorf("first request: %d, want 200", c)
	}
	if n := held(t, l); n != 1 {
		t.Errorf("%d slots held after one request returned, want 1", n)
	}
	if rec := do(h, req{}); rec.Code != http.StatusOK {
		t.Errorf("a request after one returned: %d, want 200", rec.Code)
	}
	release <- struct{}{}
	<-codes
	if n := held(t, l); n != 0 {
		t.Errorf("%d slots held after every request returned, want 0", n)
	}
}

// TestConcurrencyReleasesOnPanicAndHangUp: a handler that panics, or whose
// client goes away, gives its slot back.
func TestConcurrencyReleasesOnPanicAndHangUp(t *testing.T) {
	l := newLimiter(t, storetest.NewClock(t0))
	panicky := httplimit.Concurrency(l, httplimit.ClientIP(), exports)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("handler failed")
	}))
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not go on up")
			}
		}()
		do(panicky, req{})
	}()
	if n := held(t, l); n != 0 {
		t.Errorf("%d slots held after a panic, want 0", n)
	}

	ctx, hangUp := context.WithCancel(context.Background())
	gone := httplimit.Concurrency(l, httplimit.ClientIP(), exports)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		hangUp()
	}))
	r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)
	r.RemoteAddr = "192.0.2.1:1234"
	gone.ServeHTTP(httptest.NewRecorder(), r)
	if n := held(t, l); n != 0 {
		t.Errorf("%d slots held after the client went away, want 0", n)
	}
}

func TestConcurrencyNeedsAConcurrentRule(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Concurrency with a Fixed window did not panic")
		}
	}()
	l := newLimiter(t, storetest.NewClock(t0))
	httplimit.Concurrency(l, httplimit.ClientIP(), countlimit.Rule{UseType: "x", Limit: 1, Window: countlimit.Fixed(time.Minute)})
}

// TestConcurrencyFailOpen: a store that is down lets requests through
// under FailOpen and answers 503 without it.
func TestConcurrencyFailOpen(t *testing.T) {
	l := countlimit.New(downStore{})
	closed := httplimit.Concurrency(l, httplimit.ClientIP(), exports)(served)
	if rec := do(closed, req{}); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("store down, fail closed: %d, want 503", rec.Code)
	}
	open := httplimit.Concurrency(l, httplimit.ClientIP(), exports, httplimit.FailOpen(nil))(served)
	if rec := do(open, req{}); rec.Code != http.StatusOK || rec.Body.String() != "ok" {
		t.Errorf("store down, fail open: %d %q, want 200 ok", rec.Code, rec.Body.String())
	}
}
