package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
)

const token = "s3cret-token-0123456789"

// call makes one request with the given Authorization header ("" for none).
func call(t *testing.T, h http.Handler, method, path, body, auth string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestToken(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	srv := server.New(server.Config{Limiter: countlimit.New(store), Rules: rulesFor(t), Logger: quiet, Token: token})
	sms := `{"rule": "sms.code", "id": "18500000000"}`
	for _, tc := range []struct {
		method, path, body, auth string
		code                     int
		challenge                string // WWW-Authenticate on a 401
	}{
		{"POST", "/v1/allow", sms, "", 401, `Bearer realm="countlimit"`},
		{"POST", "/v1/reset", sms, "", 401, `Bearer realm="countlimit"`},
		{"POST", "/v1/refund", sms, "Basic " + token, 401, `Bearer realm="countlimit"`},
		{"POST", "/v1/allow", sms, "Bearer", 401, `Bearer realm="countlimit"`},
		{"POST", "/v1/allow", sms, "Bearer wrong-token-0123456789", 401, `Bearer realm="countlimit", error="invalid_token"`},
		{"POST", "/v1/allow", sms, "Bearer " + token + "x", 401, `Bearer realm="countlimit", error="invalid_token"`},
		{"POST", "/v1/allow", sms, "Bearer " + token[:len(token)-1], 401, `Bearer realm="countlimit", error="invalid_token"`},
		{"GET", "/v1/rules", "", "", 401, `Bearer realm="countlimit"`},
		{"GET", "/metrics", "", "", 401, `Bearer realm="countlimit"`},
		{"GET", "/v1/nothing", "", "", 401, `Bearer realm="countlimit"`},
		{"POST", "/v1/allow", sms, "Bearer " + token, 200, ""},
		{"POST", "/v1/refund", sms, "bearer  " + token, 200, ""},
		{"POST", "/v1/reset", sms, "Bearer " + token, 200, ""},
		{"GET", "/v1/rules", "", "Bearer " + token, 200, ""},
		{"GET", "/metrics", "", "Bearer " + token, 200, ""},
		{"GET", "/healthz", "", "", 200, ""},
		{"GET", "/healthz", "", "Bearer wrong", 200, ""},
	} {
		rec := call(t, srv, tc.method, tc.path, tc.body, tc.auth)
		if rec.Code != tc.code || rec.Header().Get("WWW-Authenticate") != tc.challenge {
			t.Errorf("%s %s with %q: %d, WWW-Authenticate %q; want %d, %q", tc.method, tc.path, tc.auth, rec.Code, rec.Header().Get("WWW-Authenticate"), tc.code, tc.challenge)
			continue
		}
		if tc.code == 401 {
			var out map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out["error"] == nil || rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("%s %s with %q: body %q, want a JSON error", tc.method, tc.path, tc.auth, rec.Body)
			}
			if strings.Contains(rec.Body.String(), token) {
				t.Errorf("%s %s: the 401 quotes the token", tc.method, tc.path)
			}
		}
	}
}

func TestMetricsOnTheirOwn(t *testing.T) {
	t.Parallel()
	srv := server.New(server.Config{Limiter: countlimit.New(failing{}), Rules: rulefile.Default(), Logger: quiet, Token: token, OmitMetrics: true})
	if rec := call(t, srv, "GET", "/metrics", "", "Bearer "+token); rec.Code != 404 || !strings.Contains(rec.Body.String(), "own address") {
		t.Errorf("GET /metrics on the API with OmitMetrics: %d %s, want 404", rec.Code, rec.Body)
	}
	call(t, srv, "POST", "/v1/allow", `{"rule": "sms.code", "id": "x"}`, "Bearer "+token)
	m := srv.Metrics()
	rec := call(t, m, "GET", "/metrics", "", "") // no token: the address is the protection
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `countlimit_store_errors_total{endpoint="allow"} 1`) || !strings.Contains(rec.Body.String(), "countlimit_store_up 0") {
		t.Errorf("GET /metrics on the metrics handler: %d, want 200 with the API's metrics:\n%s", rec.Code, rec.Body)
	}
	for _, path := range []string{"/v1/allow", "/healthz", "/"} {
		if rec := call(t, m, "POST", path, `{"rule": "sms.code", "id": "x"}`, "Bearer "+token); rec.Code != 404 {
			t.Errorf("POST %s on the metrics handler: %d, want 404", path, rec.Code)
		}
	}
}

// rawRequest sends head and then part of a body on a fresh connection to
// ts, calls then, and returns the response.
func rawRequest(t *testing.T, ts *httptest.Server, head, body string, then func(*net.TCPConn)) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a guard against hanging, not an assertion
	if _, err := io.WriteString(c, head+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	then(c.(*net.TCPConn))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestBodyReadErrors(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	ts := httptest.NewUnstartedServer(server.New(server.Config{Limiter: countlimit.New(store), Rules: rulesFor(t), Logger: quiet}))
	// The client below stalls for good: the read timeout is what ends it.
	ts.Config.ReadTimeout = 200 * time.Millisecond
	ts.Start()
	defer ts.Close()
	head := "POST /v1/allow HTTP/1.1\r\nHost: countlimit\r\nContent-Type: application/json\r\nContent-Length: 100"
	for _, tc := range []struct {
		name  string
		then  func(*net.TCPConn)
		code  int
		error string
	}{
		{"stalled", func(*net.TCPConn) {}, http.StatusRequestTimeout, "request body too slow"},
		{"cut short", func(c *net.TCPConn) { _ = c.CloseWrite() }, http.StatusBadRequest, "could not read the request body"},
	} {
		resp, body := rawRequest(t, ts, head, `{"rule": "sms.code", "id": "x"`, tc.then)
		var out struct{ Error string }
		if err := json.Unmarshal([]byte(body), &out); err != nil || resp.StatusCode != tc.code || !strings.HasPrefix(out.Error, tc.error) {
			t.Errorf("%s body: %d %q; want %d and %q", tc.name, resp.StatusCode, body, tc.code, tc.error)
		}
		if strings.Contains(body, "127.0.0.1") || strings.Contains(body, "tcp") || strings.Contains(body, "i/o") {
			t.Errorf("%s body: the answer quotes the read error: %q", tc.name, body)
		}
	}
}

func TestIDsDecodeExactly(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	srv := server.New(server.Config{Limiter: countlimit.New(store), Rules: rulesFor(t), Logger: quiet})
	for i, tc := range []struct {
		body  string
		code  int
		field string
		used  float64
	}{
		// encoding/json alone would make all of these U+FFFD, one counter.
		{`{"rule": "sms.code", "id": "\ud800"}`, 400, "id", 0},
		{`{"rule": "sms.code", "id": "\udbff"}`, 400, "id", 0},
		{`{"rule": "sms.code", "id": "\udc00x"}`, 400, "id", 0},
		{`{"rule": "sms.code", "id": "\ud83d\u0041"}`, 400, "id", 0},
		{"{\"rule\": \"sms.code\", \"id\": \"a\xffb\"}", 400, "id", 0},
		{"{\"rule\": \"sms.code\", \"id\": \"a\xfeb\"}", 400, "id", 0},
		{"{\"rule\": \"sms\xff.code\", \"id\": \"x\"}", 400, "rule", 0},
		{"{\"rule\": \"post.create\", \"id\": \"x\", \"tier\": \"gold\\udfff\"}", 400, "tier", 0},
		{`{"rule": "sms.code", "id": 42}`, 400, "id", 0},
		// A real U+FFFD is an id like any other, and a pair is its character.
		{`{"rule": "sms.code", "id": "\ufffd"}`, 200, "", 1},
		{`{"rule": "sms.code", "id": "\ud83d\ude00"}`, 200, "", 1},
		{`{"rule": "sms.code", "id": "😀"}`, 200, "", 2},
		{`{"rule": "sms.code", "id": "\\ud800"}`, 200, "", 1},
	} {
		rec := call(t, srv, "POST", "/v1/allow", tc.body, "")
		var out map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		if rec.Code != tc.code || tc.field != "" && out["field"] != tc.field {
			t.Errorf("step %d: POST /v1/allow %s: %d %s; want %d naming field %q", i, tc.body, rec.Code, rec.Body, tc.code, tc.field)
			continue
		}
		if tc.code == 200 {
			if used := out["results"].([]any)[0].(map[string]any)["used"]; used != tc.used {
				t.Errorf("step %d: POST /v1/allow %s: used %v, want %v", i, tc.body, used, tc.used)
			}
		}
	}
}

// blockingPing is a Ping that ignores its context and answers only when
// the test ends: the worst a store driver can do.
func blockingPing(t *testing.T, calls *atomic.Int32) func(context.Context) error {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return func(context.Context) error {
		calls.Add(1)
		<-release
		return nil
	}
}

func TestHealthzStalledPing(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	srv := server.New(server.Config{
		Limiter:       countlimit.New(failing{}),
		Rules:         rulefile.Default(),
		Logger:        quiet,
		Ping:          blockingPing(t, &calls),
		HealthTimeout: 50 * time.Millisecond,
	})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			code, out := api{t, ts.URL}.do("GET", "/healthz", "")
			if code != 503 || out["status"] != "unavailable" || !strings.Contains(fmt.Sprint(out["reason"]), "did not answer a ping within 50ms") || out["since"] == nil {
				t.Errorf("healthz with a stalled ping: %d %v, want 503 with a reason", code, out)
			}
		})
	}
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("4 probes started %d pings, want 1 (they share the one in flight)", n)
	}
}

// toggle is a memstore that fails while down is set.
type toggle struct {
	down atomic.Bool
	*memstore.Store
}

func (s *toggle) Do(ctx context.Context, r *driver.Request) error {
	if s.down.Load() {
		return driver.Unavailable(errors.New("dial tcp 10.0.0.5:5432: connection refused"))
	}
	return s.Store.Do(ctx, r)
}

// logBuf is a log destination safe to read while the server writes.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns how many log lines have msg as their message.
func (l *logBuf) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), `"msg":"`+msg+`"`)
}

func TestOutageLogsTransitions(t *testing.T) {
	t.Parallel()
	store := &toggle{Store: memstore.New()}
	t.Cleanup(func() { store.Close() })
	var logs logBuf
	ping := func(context.Context) error { return nil }
	srv := server.New(server.Config{Limiter: countlimit.New(store), Rules: rulesFor(t), Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Ping: ping})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := api{t, ts.URL}
	allow := func(want int) {
		if code, out := a.do("POST", "/v1/allow", `{"rule": "api", "id": "u1"}`); code != want {
			t.Errorf("allow: %d %v, want %d", code, out, want)
		}
	}
	health := func(want int) map[string]any {
		code, out := a.do("GET", "/healthz", "")
		if code != want {
			t.Errorf("healthz: %d %v, want %d", code, out, want)
		}
		return out
	}
	allow(200)
	store.down.Store(true)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 10 {
				allow(503)
			}
		})
	}
	wg.Wait()
	// The ping answers, but checks fail: unhealthy.
	if out := health(503); !strings.Contains(fmt.Sprint(out["reason"]), "checks are failing: 100 store errors") || strings.Contains(fmt.Sprint(out), "10.0.0.5") {
		t.Errorf("healthz while checks fail: %v", out)
	}
	if _, m := a.do("GET", "/metrics", ""); !strings.Contains(m["text"].(string), "countlimit_store_up 0") {
		t.Error("countlimit_store_up is not 0 during the outage")
	}
	store.down.Store(false)
	for range 10 {
		allow(200)
	}
	health(200)
	if _, m := a.do("GET", "/metrics", ""); !strings.Contains(m["text"].(string), "countlimit_store_up 1") ||
		!strings.Contains(m["text"].(string), `countlimit_store_errors_total{endpoint="allow"} 100`) {
		t.Error("metrics after the outage: want countlimit_store_up 1 and 100 allow errors")
	}
	if down, back := logs.count("store unavailable"), logs.count("store is back"); down != 1 || back != 1 {
		t.Errorf("100 failing requests then recovery logged %d outage lines and %d recovery lines, want 1 and 1:\n%s", down, back, logs.b.String())
	}
	if !strings.Contains(logs.b.String(), `"errors":100`) {
		t.Errorf("the recovery line does not count the outage's errors:\n%s", logs.b.String())
	}
}

func TestHealthzRemembersFailedChecks(t *testing.T) {
	t.Parallel()
	store := &toggle{Store: memstore.New()}
	t.Cleanup(func() { store.Close() })
	var logs logBuf
	srv := server.New(server.Config{Limiter: countlimit.New(store), Rules: rulesFor(t), Logger: slog.New(slog.NewJSONHandler(&logs, nil)), FailureMemory: time.Minute})
	now := time.Date(2026, 5, 11, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	server.SetNow(srv, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	store.down.Store(true)
	for step, s := range []struct {
		advance time.Duration
		code    int
	}{
		{0, 503},
		{59 * time.Second, 503},
		{time.Second, 200}, // a minute without a failing check, no Ping: healthy
	} {
		advance(s.advance)
		if step == 0 {
			if rec := call(t, srv, "POST", "/v1/peek", `{"rule": "api", "id": "u1"}`, ""); rec.Code != 503 {
				t.Fatalf("peek on a failing store: %d", rec.Code)
			}
			store.down.Store(false) // nothing calls it until the memory has passed
		}
		if rec := call(t, srv, "GET", "/healthz", "", ""); rec.Code != s.code {
			t.Errorf("step %d: healthz %d %s, want %d", step, rec.Code, rec.Body, s.code)
		}
	}
	if down, back := logs.count("store unavailable"), logs.count("store is back"); down != 1 || back != 1 {
		t.Errorf("logged %d outage lines and %d recovery lines, want 1 and 1", down, back)
	}
}

func TestStartDown(t *testing.T) {
	t.Parallel()
	store := &toggle{Store: memstore.New()}
	t.Cleanup(func() { store.Close() })
	store.down.Store(true)
	var logs logBuf
	var pingFails atomic.Bool
	pingFails.Store(true)
	srv := server.New(server.Config{
		Limiter: countlimit.New(store),
		Rules:   rulesFor(t),
		Logger:  slog.New(slog.NewJSONHandler(&logs, nil)),
		Ping: func(context.Context) error {
			if pingFails.Load() {
				return errors.New("connection refused")
			}
			return nil
		},
		StartErr: errors.New("--store postgres://db/x: connection refused"),
	})
	if n := logs.count("store unavailable at start; serving, unhealthy until it answers"); n != 1 {
		t.Fatalf("New with StartErr logged %d warnings, want 1: %s", n, logs.b.String())
	}
	for range 5 {
		if rec := call(t, srv, "GET", "/healthz", "", ""); rec.Code != 503 || !strings.Contains(rec.Body.String(), `"reason":"the store failed a ping"`) {
			t.Errorf("healthz with the store down at start: %d %s", rec.Code, rec.Body)
		}
		if rec := call(t, srv, "POST", "/v1/allow", `{"rule": "api", "id": "u1"}`, ""); rec.Code != 503 {
			t.Errorf("allow with the store down at start: %d %s", rec.Code, rec.Body)
		}
	}
	store.down.Store(false)
	pingFails.Store(false)
	if rec := call(t, srv, "POST", "/v1/allow", `{"rule": "api", "id": "u1"}`, ""); rec.Code != 200 {
		t.Errorf("allow with the store back: %d %s", rec.Code, rec.Body)
	}
	if rec := call(t, srv, "GET", "/healthz", "", ""); rec.Code != 200 {
		t.Errorf("healthz with the store back: %d %s", rec.Code, rec.Body)
	}
	if total, down, back := strings.Count(logs.b.String(), "\n"), logs.count("store unavailable"), logs.count("store is back"); total != 2 || down != 0 || back != 1 {
		t.Errorf("logged %d lines, %d outage and %d recovery; want the start warning and one recovery:\n%s", total, down, back, logs.b.String())
	}
}
