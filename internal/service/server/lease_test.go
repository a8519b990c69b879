package server_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
	"github.com/countlimit/countlimit/internal/testkit/leaseforge"
)

// leaseRules holds concurrent rules, one with tiers, beside a counting rule
// and a group.
func leaseRules(t *testing.T) *rulefile.File {
	t.Helper()
	f, err := rulefile.Parse("lease rules", []byte(`
rules:
  export.running: {window: concurrent 10m, limit: 3}
  upload: {window: concurrent 1m, tiers: {free: 1, pro: 2}}
  sms.code: {window: sliding 5m, limit: 2}
  conversation.hour: {window: fixed 1h, limit: 10}
  conversation.day: {window: fixed 24h, limit: 50}
groups:
  conversation.create: {rules: [conversation.hour, conversation.day]}
`))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// acquire posts body to /v1/acquire and returns the lease string, "" when
// denied, checking allowed and used/limit.
func (a api) acquire(body string, allowed bool, retry float64, used string) string {
	a.t.Helper()
	out := a.expect("/v1/acquire", body, allowed, retry, used)
	lease, has := out["lease"].(string)
	switch {
	case allowed && (!has || !strings.HasPrefix(lease, "cl1.")):
		a.t.Fatalf("POST /v1/acquire %s: allowed without a lease string: %v", body, out)
	case !allowed && out["lease"] != nil:
		a.t.Fatalf("POST /v1/acquire %s: denied with a lease: %v", body, out)
	}
	return lease
}

// leaseCall posts {"lease": lease} plus extra fields to path and checks the
// status, and for errors the field named.
func (a api) leaseCall(path, lease, extra string, code int, field string) map[string]any {
	a.t.Helper()
	body := fmt.Sprintf(`{"lease": %q%s}`, lease, extra)
	got, out := a.do("POST", path, body)
	if got != code || (code != 200 && (out["error"] == nil || out["field"] != field)) {
		a.t.Fatalf("POST %s %s: %d %v, want %d naming field %q", path, body, got, out, code, field)
	}
	return out
}

func TestLeases(t *testing.T) {
	store := memstore.New(memstore.WithJanitorInterval(0))
	defer store.Close()
	t0 := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	clock := storetest.NewClock(t0)
	ts := httptest.NewServer(server.New(server.Config{
		Limiter: countlimit.New(store, countlimit.WithClock(clock.Now)),
		Rules:   leaseRules(t),
		Logger:  quiet,
	}))
	defer ts.Close()
	a := api{t, ts.URL}

	// Three slots, then a denial until the oldest lease expires.
	export := `{"rule": "export.running", "id": "u1"}`
	l1 := a.acquire(export, true, 0, "1/3")
	l2 := a.acquire(export, true, 0, "2/3")
	l3 := a.acquire(export, true, 0, "3/3")
	if l1 == l2 || l2 == l3 {
		t.Fatal("two acquires returned the same lease")
	}
	a.acquire(export, false, 600, "3/3")
	a.expect("/v1/peek", export, false, 600, "3/3")
	a.acquire(`{"rule": "export.running", "id": "u2"}`, true, 0, "1/3") // another id has slots of its own

	// Release frees exactly that slot, and is idempotent.
	if out := a.leaseCall("/v1/release", l1, "", 200, ""); out["released"] != true || len(out) != 1 {
		t.Errorf("release: %v, want {released: true}", out)
	}
	a.leaseCall("/v1/release", l1, "", 200, "")
	a.expect("/v1/peek", export, true, 0, "2/3")
	clock.Set(t0.Add(time.Minute))
	l4 := a.acquire(export, true, 0, "3/3")

	// Extend keeps l2 past its first ttl; l3 expires and frees its slot.
	clock.Set(t0.Add(5 * time.Minute))
	if out := a.leaseCall("/v1/extend", l2, `, "rule": "export.running", "id": "u1"`, 200, ""); out["extended"] != true || out["expires_in_seconds"] != 600.0 {
		t.Errorf("extend: %v, want extended, expires in 600 s", out)
	}
	clock.Set(t0.Add(10*time.Minute + 30*time.Second))
	out := a.leaseCall("/v1/extend", l3, "", http.StatusConflict, "lease")
	if !strings.Contains(out["error"].(string), "lease expired or released") {
		t.Errorf("extend of an expired lease: %v", out)
	}
	a.leaseCall("/v1/extend", l1, "", http.StatusConflict, "lease") // released
	a.leaseCall("/v1/release", l3, "", 200, "")                     // expired: not an error
	a.expect("/v1/peek", export, true, 0, "2/3")
	clock.Set(t0.Add(14 * time.Minute))
	a.expect("/v1/peek", export, true, 0, "1/3") // l4 expired at 11m, l2 lives until 15m
	a.leaseCall("/v1/extend", l2, "", 200, "")
	a.leaseCall("/v1/release", l4, `, "id": "u1"`, 200, "")

	// A tiered concurrent rule.
	a.acquire(`{"rule": "upload", "id": "u1", "tier": "free"}`, true, 0, "1/1")
	a.acquire(`{"rule": "upload", "id": "u1", "tier": "free"}`, false, 60, "1/1")
	a.acquire(`{"rule": "upload", "id": "u1", "tier": "pro"}`, true, 0, "2/2")

	// A malformed, edited or forged lease, or one named with another
	// rule or id, is refused and frees nothing.
	parts := strings.Split(l2, ".")
	tok := []byte(parts[4])
	tok[0] ^= 1
	edited := strings.Join(append(parts[:4:4], string(tok), parts[5]), ".")
	otherStore := memstore.New(memstore.WithJanitorInterval(0))
	defer otherStore.Close()
	other := countlimit.New(otherStore)
	rule, _ := leaseRules(t).Resolve("export.running", "")
	stranger, _, err := other.Acquire(context.Background(), rule[0], "u1")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/release", "/v1/extend"} {
		for _, tc := range []struct {
			lease, extra, field string
		}{
			{"", "", "lease"},
			{"abc", "", "lease"},
			{l2 + "x", "", "lease"},
			{edited, "", "lease"},
			{strings.Replace(l2, parts[2], "dTI", 1), "", "lease"},      // another id, same token
			{leaseforge.WithTTL(l2, 100*365*24*time.Hour), "", "lease"}, // its ttl edited, its checksum made anew
			{l2, `, "rule": "sms.code"`, "rule"},
			{l2, `, "rule": "conversation.create"`, "rule"},
			{l2, `, "rule": "nope"`, "rule"},
			{l2, `, "id": "u2"`, "id"},
			{l2, `, "tier": "pro"`, "tier"},
			{l2, `, "id": 7`, "id"},
		} {
			a.leaseCall(path, tc.lease, tc.extra, 400, tc.field)
		}
		if code, out := a.do("POST", path, `{"lease": 1}`); code != 400 || out["field"] != "lease" {
			t.Errorf("POST %s with a number for a lease: %d %v", path, code, out)
		}
		if code, out := a.do("POST", path, ""); code != 400 || !strings.Contains(out["error"].(string), `{"lease": `) {
			t.Errorf("POST %s with no body: %d %v", path, code, out)
		}
		if code, _ := a.do("GET", path, ""); code != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: %d, want 405", path, code)
		}
	}
	// A well-formed lease this store never gave out holds nothing.
	a.leaseCall("/v1/release", stranger.String(), "", 200, "")
	a.leaseCall("/v1/extend", stranger.String(), "", http.StatusConflict, "lease")
	a.expect("/v1/peek", export, true, 0, "1/3")

	// Acquire takes one concurrent rule; allow and refund take none.
	for _, tc := range []struct {
		path, body, field, msg string
	}{
		{"/v1/acquire", `{"rule": "sms.code", "id": "u1"}`, "rule", "acquire takes a rule with a concurrent window; sms.code has sliding 5m"},
		{"/v1/acquire", `{"rule": "conversation.create", "id": "u1"}`, "rule", "conversation.create is a group"},
		{"/v1/acquire", `{"rule": "export.running", "id": "u1", "cost": 1}`, "cost", "acquire takes no cost"},
		{"/v1/acquire", `{"rule": "upload", "id": "u1"}`, "tier", "needs a tier"},
		{"/v1/acquire", `{"rule": "export.running"}`, "id", "id"},
		{"/v1/acquire", `{"rule": "export.running", "id": "u1", "lease": "x"}`, "lease", "unknown field"},
		{"/v1/allow", export, "rule", "export.running has a concurrent window: it holds slots, not events"},
		{"/v1/refund", export, "rule", "concurrent window"},
	} {
		code, out := a.do("POST", tc.path, tc.body)
		if code != 400 || out["field"] != tc.field || !strings.Contains(fmt.Sprint(out["error"]), tc.msg) {
			t.Errorf("POST %s %s: %d %v; want 400 naming %q, saying %q", tc.path, tc.body, code, out, tc.field, tc.msg)
		}
	}
	if code, out := a.do("POST", "/v1/reset", export); code != 200 {
		t.Errorf("reset of a concurrent rule: %d %v", code, out)
	}
	a.expect("/v1/peek", export, true, 0, "0/3")

	_, m := a.do("GET", "/metrics", "")
	for _, want := range []string{
		`countlimit_decisions_total{rule="export.running",verdict="allowed"} 5`,
		`countlimit_decisions_total{rule="export.running",verdict="denied"} 1`,
		`countlimit_decisions_total{rule="upload",verdict="denied"} 1`,
		`countlimit_request_duration_seconds_count{endpoint="acquire"}`,
		`countlimit_request_duration_seconds_count{endpoint="release"}`,
		`countlimit_request_duration_seconds_count{endpoint="extend"}`,
		`countlimit_store_errors_total{endpoint="extend"} 0`,
	} {
		if !strings.Contains(m["text"].(string), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestLeasesStoreDownAndToken(t *testing.T) {
	rf := leaseRules(t)
	rule, _ := rf.Resolve("export.running", "")
	store := memstore.New(memstore.WithJanitorInterval(0))
	defer store.Close()
	ls, _, err := countlimit.New(store).Acquire(context.Background(), rule[0], "u1")
	if err != nil {
		t.Fatal(err)
	}
	lease := fmt.Sprintf(`{"lease": %q}`, ls)

	down := httptest.NewServer(server.New(server.Config{Limiter: countlimit.New(failing{}), Rules: rf, Logger: quiet}))
	defer down.Close()
	a := api{t, down.URL}
	for _, tc := range []struct{ path, body string }{
		{"/v1/acquire", `{"rule": "export.running", "id": "u1"}`},
		{"/v1/release", lease},
		{"/v1/extend", lease},
	} {
		if code, out := a.do("POST", tc.path, tc.body); code != 503 || out["error"] != "store unavailable" {
			t.Errorf("POST %s with the store down: %d %v, want 503", tc.path, code, out)
		}
	}
	if _, out := a.do("GET", "/metrics", ""); !strings.Contains(out["text"].(string), `countlimit_store_errors_total{endpoint="release"} 1`) {
		t.Error("metrics lack the release's store error")
	}

	h := server.New(server.Config{Limiter: countlimit.New(failing{}), Rules: rf, Logger: quiet, Token: token})
	for _, path := range []string{"/v1/acquire", "/v1/release", "/v1/extend"} {
		if rec := call(t, h, "POST", path, lease, ""); rec.Code != http.StatusUnauthorized {
			t.Errorf("POST %s without a token: %d, want 401", path, rec.Code)
		}
		if rec := call(t, h, "POST", path, lease, "Bearer "+token); rec.Code == http.StatusUnauthorized {
			t.Errorf("POST %s with the token: 401", path)
		}
	}
	big := `{"lease": "` + strings.Repeat("x", server.MaxBodyBytes) + `"}`
	if rec := call(t, h, "POST", "/v1/release", big, "Bearer "+token); rec.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("POST /v1/release with a body over the cap: %d, want 413", rec.Code)
	}
}
