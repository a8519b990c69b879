package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

func TestMain(m *testing.M) { testbackend.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// api is a test client for one server.
type api struct {
	t   *testing.T
	url string
}

func (a api) do(method, path, body string) (int, map[string]any) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &out); err != nil {
			a.t.Fatalf("%s %s: bad JSON %q: %v", method, path, raw, err)
		}
	} else {
		out = map[string]any{"text": string(raw)}
	}
	return resp.StatusCode, out
}

// expect checks a verdict: allowed, the retry, and per rule "used/limit".
func (a api) expect(path, body string, allowed bool, retry float64, used ...string) map[string]any {
	a.t.Helper()
	code, out := a.do("POST", path, body)
	if code != http.StatusOK {
		a.t.Fatalf("POST %s %s: %d %v", path, body, code, out)
	}
	if out["allowed"] != allowed || out["retry_after_seconds"] != retry {
		a.t.Fatalf("POST %s %s: allowed %v retry %v, want %v %v (%v)", path, body, out["allowed"], out["retry_after_seconds"], allowed, retry, out)
	}
	results := out["results"].([]any)
	if len(results) != len(used) {
		a.t.Fatalf("POST %s %s: %d results, want %d", path, body, len(results), len(used))
	}
	for i, r := range results {
		m := r.(map[string]any)
		if got := jsonNum(m["used"]) + "/" + jsonNum(m["limit"]); got != used[i] {
			a.t.Errorf("POST %s %s: result %d (%v) used/limit = %s, want %s", path, body, i, m["rule"], got, used[i])
		}
	}
	return out
}

func jsonNum(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// rulesFor returns the built-in rules renamed to use types unique to t, so
// tests on a shared database do not meet each other's counters.
func rulesFor(t *testing.T) *rulefile.File {
	f := rulefile.Default()
	suffix := string(storetest.UseType(t, ""))
	for _, r := range f.Rules {
		r.UseType += countlimit.UseType(suffix)
	}
	return f
}

func TestAPI(t *testing.T) {
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			store := b.Open(t)
			clock := storetest.NewClock(time.Date(2026, 5, 11, 22, 0, 0, 0, shanghai))
			srv := server.New(server.Config{
				Limiter: countlimit.New(store, countlimit.WithClock(clock.Now)),
				Rules:   rulesFor(t),
				Logger:  quiet,
			})
			ts := httptest.NewServer(srv)
			defer ts.Close()
			a := api{t, ts.URL}

			sms := `{"rule": "sms.code", "id": "18500000000"}`
			a.expect("/v1/allow", sms, true, 0, "1/2")
			out := a.expect("/v1/allow", sms, true, 0, "2/2")
			if got := out["results"].([]any)[0].(map[string]any)["reset_at"]; got != "2026-05-11T14:05:00Z" {
				t.Errorf("reset_at = %v, want 2026-05-11T14:05:00Z", got)
			}
			a.expect("/v1/allow", sms, false, 300, "2/2")
			a.expect("/v1/peek", sms, false, 300, "2/2")
			if out := a.expect("/v1/refund", sms, true, 0, "1/2"); out["refunded"] != 1.0 {
				t.Errorf("refund: %v, want refunded 1", out)
			}
			a.expect("/v1/allow", `{"rule": "sms.code", "id": "18500000000", "cost": 2}`, false, 300, "1/2")
			if code, out := a.do("POST", "/v1/reset", sms); code != 200 || out["reset"] != true {
				t.Fatalf("reset: %d %v", code, out)
			}
			a.expect("/v1/allow", `{"rule": "sms.code", "id": "18500000000", "cost": 2}`, true, 0, "2/2")

			// Tiers.
			a.expect("/v1/allow", `{"rule": "post.create", "id": "m1", "tier": "bronze"}`, true, 0, "1/3")
			a.expect("/v1/allow", `{"rule": "post.create", "id": "m1", "tier": "gold"}`, true, 0, "2/8")
			a.expect("/v1/allow", `{"rule": "api", "id": "k1"}`, true, 0, "1/10")
			a.expect("/v1/allow", `{"rule": "api", "id": "k1", "tier": "registered"}`, true, 0, "2/100")
			// Forgetting a tiered rule's counter needs no tier.
			if code, out := a.do("POST", "/v1/reset", `{"rule": "post.create", "id": "m1"}`); code != 200 {
				t.Errorf("reset of a tier-only rule without a tier: %d %v", code, out)
			}
			a.expect("/v1/peek", `{"rule": "post.create", "id": "m1", "tier": "gold"}`, true, 0, "0/8")

			// A group: 10 per hour AND 50 per day, all or nothing.
			conv := `{"rule": "conversation.create", "id": "u9"}`
			for i := 1; i <= 10; i++ {
				a.expect("/v1/allow", conv, true, 0, jsonNum(i)+"/10", jsonNum(i)+"/50")
			}
			a.expect("/v1/allow", conv, false, 3600, "10/10", "10/50")
			a.expect("/v1/peek", conv, false, 3600, "10/10", "10/50")

			// The penalty box.
			login := `{"rule": "login", "id": "10.0.0.1"}`
			for i := 1; i <= 5; i++ {
				a.expect("/v1/allow", login, true, 0, jsonNum(i)+"/5")
			}
			out = a.expect("/v1/allow", login, false, 1800, "5/5")
			if got := out["results"].([]any)[0].(map[string]any)["blocked_until"]; got != "2026-05-11T14:30:00Z" {
				t.Errorf("blocked_until = %v", got)
			}

			code, out := a.do("GET", "/healthz", "")
			if code != 200 || out["status"] != "ok" {
				t.Errorf("healthz: %d %v", code, out)
			}
			code, out = a.do("GET", "/metrics", "")
			for _, want := range []string{
				`countlimit_decisions_total{rule="sms.code",verdict="allowed"} 3`,
				`countlimit_decisions_total{rule="sms.code",verdict="denied"} 2`,
				`countlimit_decisions_total{rule="conversation.create",verdict="denied"} 1`,
				`countlimit_request_duration_seconds_count{endpoint="allow"}`,
			} {
				if code != 200 || !strings.Contains(out["text"].(string), want) {
					t.Errorf("metrics lack %q", want)
				}
			}
		})
	}
}

func TestRulesList(t *testing.T) {
	ts := httptest.NewServer(server.New(server.Config{Limiter: countlimit.New(failing{}), Rules: rulefile.Default(), Logger: quiet}))
	defer ts.Close()
	code, out := api{t, ts.URL}.do("GET", "/v1/rules", "")
	if code != 200 {
		t.Fatal(code, out)
	}
	rules := out["rules"].([]any)
	if len(rules) != 10 {
		t.Fatalf("%d rules listed, want 10", len(rules))
	}
	first := rules[0].(map[string]any)
	if first["name"] != "sms.code" || first["window"] != "sliding 5m" || first["limit"] != 2.0 {
		t.Errorf("first rule = %v", first)
	}
	if export := rules[6].(map[string]any); export["name"] != "export.running" || export["window"] != "concurrent 10m" || export["limit"] != 3.0 {
		t.Errorf("the concurrent rule = %v", export)
	}
	last := rules[9].(map[string]any)
	if last["name"] != "conversation.create" || jsonNum(last["rules"]) != `["conversation.hour","conversation.day"]` {
		t.Errorf("group = %v", last)
	}
}

func TestBadRequests(t *testing.T) {
	srv := server.New(server.Config{Limiter: countlimit.New(failing{}), Rules: rulefile.Default(), Logger: quiet})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := api{t, ts.URL}
	for _, tc := range []struct {
		method, path, body string
		code               int
		field              string
	}{
		{"POST", "/v1/allow", "", 400, ""},
		{"POST", "/v1/allow", "{", 400, ""},
		{"POST", "/v1/allow", `{"rule": "sms.code", "id": "x"} {}`, 400, ""},
		{"POST", "/v1/allow", `{"rule": "sms.code", "idd": "x"}`, 400, "idd"},
		{"POST", "/v1/allow", `{"rule": "sms.code", "id": "x", "cost": "two"}`, 400, "cost"},
		{"POST", "/v1/allow", `{"id": "x"}`, 400, "rule"},
		{"POST", "/v1/allow", `{"rule": "nope", "id": "x"}`, 400, "rule"},
		{"POST", "/v1/allow", `{"rule": "sms.code"}`, 400, "id"},
		{"POST", "/v1/allow", `{"rule": "sms.code", "id": "` + strings.Repeat("x", 513) + `"}`, 400, "id"},
		{"POST", "/v1/allow", `{"rule": "sms.code", "id": "a\u0000b"}`, 400, "id"},
		{"POST", "/v1/allow", `{"rule": "sms.code", "id": "x", "cost": 0}`, 400, "cost"},
		{"POST", "/v1/allow", `{"rule": "api", "id": "x", "cost": 9007199254740993}`, 400, "cost"},
		{"POST", "/v1/refund", `{"rule": "sms.code", "id": "x", "cost": -1}`, 400, "cost"},
		{"POST", "/v1/peek", `{"rule": "sms.code", "id": "x", "cost": 2}`, 400, "cost"},
		{"POST", "/v1/allow", `{"rule": "conversation.create", "id": "x", "cost": 2}`, 400, "cost"},
		{"POST", "/v1/allow", `{"rule": "post.create", "id": "x"}`, 400, "tier"},
		{"POST", "/v1/allow", `{"rule": "post.create", "id": "x", "tier": "platinum"}`, 400, "tier"},
		{"POST", "/v1/allow", `{"rule": "sms.code", "id": "` + strings.Repeat("x", server.MaxBodyBytes) + `"}`, 413, ""},
		{"GET", "/v1/nothing", "", 404, ""},
	} {
		code, out := a.do(tc.method, tc.path, tc.body)
		if code != tc.code || (code != 405 && out["error"] == nil) || (tc.field != "" && out["field"] != tc.field) {
			body := tc.body
			if len(body) > 60 {
				body = body[:60] + "..."
			}
			t.Errorf("%s %s %s: %d %v; want %d naming field %q", tc.method, tc.path, body, code, out, tc.code, tc.field)
		}
	}
	if code, _ := a.do("GET", "/v1/allow", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/allow: %d, want 405", code)
	}
}

// failing is a store that is down.
type failing struct{}

func (failing) Do(context.Context, *driver.Request) error {
	return driver.Unavailable(errors.New("connection refused"))
}

func TestStoreDown(t *testing.T) {
	var logs bytes.Buffer
	srv := server.New(server.Config{
		Limiter: countlimit.New(failing{}),
		Rules:   rulefile.Default(),
		Ping:    func(context.Context) error { return errors.New("connection refused") },
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
	})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := api{t, ts.URL}
	for _, path := range []string{"/v1/allow", "/v1/peek", "/v1/refund", "/v1/reset"} {
		code, out := a.do("POST", path, `{"rule": "conversation.create", "id": "x"}`)
		if code != 503 || out["error"] != "store unavailable" {
			t.Errorf("POST %s with the store down: %d %v, want 503", path, code, out)
		}
	}
	if code, out := a.do("GET", "/healthz", ""); code != 503 || out["status"] != "unavailable" {
		t.Errorf("healthz with the store down: %d %v", code, out)
	}
	if _, out := a.do("GET", "/metrics", ""); !strings.Contains(out["text"].(string), `countlimit_store_errors_total{endpoint="allow"} 1`) {
		t.Error("metrics lack the store error")
	}
	if strings.Count(logs.String(), "msg=\"store unavailable\"") != 1 || strings.Contains(logs.String(), `"x"`) {
		t.Errorf("logs: %s", logs.String())
	}
}

// lockedRow answers as pgstore does for an id another transaction holds
// locked: it waits for the call's context, then fails with ErrLocked.
type lockedRow struct{}

func (lockedRow) Do(ctx context.Context, _ *driver.Request) error {
	<-ctx.Done()
	return fmt.Errorf("%w: %w", countlimit.ErrLocked, ctx.Err())
}

// TestLockedIDIsNoOutage: a check that waits out the store timeout on an
// id another transaction holds answers 503 with Retry-After, but is no
// store error: /healthz stays 200, nothing is logged as an outage, and the
// locked-check counter shows it.
func TestLockedIDIsNoOutage(t *testing.T) {
	var logs bytes.Buffer
	metrics, observe := server.NewMetrics()
	srv := server.New(server.Config{
		Limiter:      countlimit.New(lockedRow{}, countlimit.WithStoreTimeout(20*time.Millisecond), observe),
		Metrics:      metrics,
		Rules:        rulefile.Default(),
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
		StoreTimeout: time.Second,
	})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := api{t, ts.URL}
	for range 3 {
		code, out := a.do("POST", "/v1/allow", `{"rule": "sms.code", "id": "x"}`)
		if code != 503 || !strings.Contains(fmt.Sprint(out["error"]), "locked by another transaction") {
			t.Errorf("allow of a locked id: %d %v, want 503 saying it is locked", code, out)
		}
	}
	if code, out := a.do("GET", "/healthz", ""); code != 200 {
		t.Errorf("healthz after locked ids: %d %v, want 200", code, out)
	}
	_, out := a.do("GET", "/metrics", "")
	for _, want := range []string{`countlimit_store_errors_total{endpoint="allow"} 0`, "countlimit_locked_total 3", "countlimit_store_failures_total 0"} {
		if !strings.Contains(out["text"].(string), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(logs.String(), "store unavailable") {
		t.Errorf("a locked id was logged as an outage: %s", logs.String())
	}
}

// TestQueuedTableLockIsAnOutage: on PostgreSQL, a DBA's LOCK TABLE
// count_limit queued behind a report's open transaction stalls every
// check, whatever its id. That is an outage, not a locked id: checks fail
// as the store failing, and /healthz says so until the table is free.
func TestQueuedTableLockIsAnOutage(t *testing.T) {
	admin := testbackend.Postgres(t)
	var logs bytes.Buffer
	srv := server.New(server.Config{
		Limiter: countlimit.New(pgstore.New(testbackend.PostgresPool(t)), countlimit.WithStoreTimeout(time.Second)),
		Rules:   rulesFor(t),
		Ping:    pgstore.New(admin).Ping,
		Logger:  slog.New(slog.NewTextHandler(&logs, nil)),
	})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := api{t, ts.URL}
	a.expect("/v1/allow", `{"rule": "sms.code", "id": "before"}`, true, 0, "1/2")

	release := testbackend.LockTable(t, admin, "count_limit", "ACCESS EXCLUSIVE", "SELECT count(*) FROM count_limit")
	for _, id := range []string{"a", "b"} {
		code, out := a.do("POST", "/v1/allow", `{"rule": "sms.code", "id": "`+id+`"}`)
		if code != 503 || out["error"] != "store unavailable" {
			t.Errorf("allow of %s with LOCK TABLE count_limit queued: %d %v, want 503 store unavailable", id, code, out)
		}
	}
	if code, out := a.do("GET", "/healthz", ""); code != 503 || out["status"] != "unavailable" {
		t.Errorf("healthz with LOCK TABLE count_limit queued and checks failing: %d %v, want 503", code, out)
	}
	if !strings.Contains(logs.String(), `msg="store unavailable"`) {
		t.Errorf("the outage was not logged: %s", logs.String())
	}

	release()
	a.expect("/v1/allow", `{"rule": "sms.code", "id": "after"}`, true, 0, "1/2")
	if code, out := a.do("GET", "/healthz", ""); code != 200 {
		t.Errorf("healthz once the table is free and a check succeeded: %d %v, want 200", code, out)
	}
}

// stuck is a store that answers only when its context ends.
type stuck struct{}

func (stuck) Do(ctx context.Context, _ *driver.Request) error {
	<-ctx.Done()
	return driver.Unavailable(ctx.Err())
}

func TestStuckStoreTimesOut(t *testing.T) {
	srv := server.New(server.Config{Limiter: countlimit.New(stuck{}), Rules: rulefile.Default(), Logger: quiet, StoreTimeout: 100 * time.Millisecond})
	// allowed gets a value each time an allow handler has returned.
	allowed := make(chan struct{}, 2)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(w, r)
		if r.URL.Path == "/v1/allow" {
			allowed <- struct{}{}
		}
	}))
	defer ts.Close()
	a := api{t, ts.URL}
	code, out := a.do("POST", "/v1/allow", `{"rule": "sms.code", "id": "x"}`)
	if code != 503 || out["error"] != "store unavailable" {
		t.Errorf("allow on a stuck store: %d %v, want 503 after the store timeout", code, out)
	}
	<-allowed
	// A client that hangs up is not a store failure.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/allow", strings.NewReader(`{"rule": "sms.code", "id": "x"}`))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	<-allowed // the hung-up request's handler is done, metrics and all
	_, m := a.do("GET", "/metrics", "")
	if !strings.Contains(m["text"].(string), `countlimit_store_errors_total{endpoint="allow"} 1`) ||
		!strings.Contains(m["text"].(string), `countlimit_store_errors_total{endpoint="peek"} 0`) {
		t.Errorf("store error metrics: want allow 1 (the timeout, not the hang-up) and peek present at 0")
	}
}
