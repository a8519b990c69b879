package server_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
)

// TestSmoothRule: the service takes a rule file's smooth rule ("smooth 1s
// burst 3"), alone and in a group beside a calendar rule: its burst at
// once, then one a tenth of a second, retry_after_seconds exact, and
// remaining what fits at once.
func TestSmoothRule(t *testing.T) {
	rules, err := rulefile.Parse("smooth.yaml", []byte(`
rules:
  api.smooth: {window: smooth 1s burst 3, limit: 10}
  api.day: {window: calendar day, limit: 100}
groups:
  api.both: {rules: [api.smooth, api.day]}
`))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.WithJanitorInterval(0))
	defer store.Close()
	clock := storetest.NewClock(time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC))
	ts := httptest.NewServer(server.New(server.Config{
		Limiter: countlimit.New(store, countlimit.WithClock(clock.Now)),
		Rules:   rules,
		Logger:  quiet,
	}))
	defer ts.Close()
	a := api{t, ts.URL}

	req := `{"rule": "api.smooth", "id": "k1"}`
	a.expect("/v1/allow", req, true, 0, "1/10")
	a.expect("/v1/allow", req, true, 0, "2/10")
	out := a.expect("/v1/allow", req, true, 0, "3/10")
	r := out["results"].([]any)[0].(map[string]any)
	if r["remaining"] != 0.0 || r["reset_at"] != "2026-05-11T09:00:00.3Z" || r["burst"] != 3.0 {
		t.Errorf("after the burst: remaining %v, reset_at %v, burst %v; want 0, 2026-05-11T09:00:00.3Z, 3", r["remaining"], r["reset_at"], r["burst"])
	}
	a.expect("/v1/allow", req, false, 0.1, "3/10")
	a.expect("/v1/allow", `{"rule": "api.smooth", "id": "k1", "cost": 4}`, false, -1, "3/10")
	clock.Set(clock.Now().Add(100 * time.Millisecond))
	a.expect("/v1/peek", req, true, 0, "2/10")
	a.expect("/v1/allow", req, true, 0, "3/10")
	a.expect("/v1/refund", req, true, 0, "2/10")

	both := `{"rule": "api.both", "id": "k2"}`
	for i := 1; i <= 3; i++ {
		a.expect("/v1/allow", both, true, 0, jsonNum(i)+"/10", jsonNum(i)+"/100")
	}
	a.expect("/v1/allow", both, false, 0.1, "3/10", "3/100")

	code, list := a.do("GET", "/v1/rules", "")
	if code != 200 || list["rules"].([]any)[0].(map[string]any)["window"] != "smooth 1s burst 3" {
		t.Errorf("GET /v1/rules: %d %v; want the smooth rule's window as written", code, list)
	}
}
