package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/service/server"
)

// counted is a store that counts its calls.
type counted struct {
	*memstore.Store
	calls atomic.Int64
}

func (s *counted) Do(ctx context.Context, r *driver.Request) error {
	s.calls.Add(1)
	return s.Store.Do(ctx, r)
}

// TestSchemaNotReady: while Config.Schema says the schema is not ready,
// checks answer 503 with its text without calling the store (bad requests
// still 400), and /healthz 503 with it as the reason; while the store
// cannot say, /healthz is the ping's and checks "store unavailable"; once
// it is ready, both serve, and it is not asked again.
func TestSchemaNotReady(t *testing.T) {
	t.Parallel()
	store := &counted{Store: memstore.New()}
	t.Cleanup(func() { store.Close() })
	const behind = `countlimit's schema here lacks migration 00002_v0_2_0.sql: run "countlimit migrate up"`
	var (
		answer atomic.Pointer[error]
		asked  atomic.Int64
		pingOK atomic.Bool
	)
	say := func(err error) { answer.Store(&err) }
	say(errors.New(behind))
	rules := rulesFor(t)
	srv := server.New(server.Config{
		Limiter: countlimit.New(store),
		Rules:   rules,
		Logger:  quiet,
		Ping: func(context.Context) error {
			if pingOK.Load() {
				return nil
			}
			return driver.Unavailable(errors.New("dial tcp 10.0.0.5:5432: connection refused"))
		},
		Schema: func(context.Context) error {
			asked.Add(1)
			return *answer.Load()
		},
	})
	allow := `{"rule": "api", "id": "u1"}`
	// A lease as /v1/acquire hands one out, taken before the schema was
	// behind, from another service on a store of its own.
	other := memstore.New()
	t.Cleanup(func() { other.Close() })
	rec := call(t, server.New(server.Config{Limiter: countlimit.New(other), Rules: rules, Logger: quiet}), "POST", "/v1/acquire", `{"rule": "export.running", "id": "u1"}`, "")
	var acquired struct{ Lease string }
	if err := json.Unmarshal(rec.Body.Bytes(), &acquired); err != nil || acquired.Lease == "" {
		t.Fatalf("acquire: %d %s %v", rec.Code, rec.Body, err)
	}
	lease := acquired.Lease

	for i := range 3 {
		if rec := call(t, srv, "GET", "/healthz", "", ""); rec.Code != 503 || !strings.Contains(rec.Body.String(), `"error":"store schema not ready"`) || !strings.Contains(rec.Body.String(), `lacks migration 00002_v0_2_0.sql: run \"countlimit migrate up\"`) {
			t.Errorf("step %d: healthz with the schema behind: %d %s", i, rec.Code, rec.Body)
		}
		for _, c := range []struct{ path, body string }{
			{"/v1/allow", allow}, {"/v1/peek", allow},
			{"/v1/acquire", `{"rule": "export.running", "id": "u1"}`},
			{"/v1/release", `{"lease": "` + lease + `"}`},
		} {
			if rec := call(t, srv, "POST", c.path, c.body, ""); rec.Code != 503 || !strings.Contains(rec.Body.String(), `lacks migration 00002_v0_2_0.sql`) {
				t.Errorf("step %d: %s with the schema behind: %d %s", i, c.path, rec.Code, rec.Body)
			}
		}
		if rec := call(t, srv, "POST", "/v1/allow", `{"rule": "nope", "id": "u1"}`, ""); rec.Code != 400 {
			t.Errorf("step %d: a bad request with the schema behind: %d %s, want 400", i, rec.Code, rec.Body)
		}
	}

	say(driver.Unavailable(errors.New("dial tcp 10.0.0.5:5432: connection refused")))
	if rec := call(t, srv, "GET", "/healthz", "", ""); rec.Code != 503 || !strings.Contains(rec.Body.String(), `"reason":"the store failed a ping"`) {
		t.Errorf("healthz while the store cannot say: %d %s, want the ping's failure", rec.Code, rec.Body)
	}
	if rec := call(t, srv, "POST", "/v1/allow", allow, ""); rec.Code != 503 || !strings.Contains(rec.Body.String(), `"error":"store unavailable"`) {
		t.Errorf("allow while the store cannot say: %d %s", rec.Code, rec.Body)
	}
	if n := store.calls.Load(); n != 0 {
		t.Errorf("the store was called %d times before its schema was ready", n)
	}

	say(nil)
	pingOK.Store(true)
	if rec := call(t, srv, "GET", "/healthz", "", ""); rec.Code != 200 {
		t.Errorf("healthz once the schema is ready: %d %s", rec.Code, rec.Body)
	}
	n := asked.Load()
	if rec := call(t, srv, "POST", "/v1/allow", allow, ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"allowed":true`) {
		t.Errorf("allow once the schema is ready: %d %s", rec.Code, rec.Body)
	}
	say(errors.New(behind))
	call(t, srv, "GET", "/healthz", "", "")
	if got := asked.Load(); got != n {
		t.Errorf("Schema asked %d more times once it said ready, want 0", got-n)
	}
}
