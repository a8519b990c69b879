package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/service/server"
)

// TestHealthzStoreSettings: while Config.Settings fails, /healthz answers
// 503 with its error as the reason, and checks go on; it is not an outage:
// nothing is logged, countlimit_store_up stays 1, and it is asked only
// after a ping that succeeds.
func TestHealthzStoreSettings(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { store.Close() })
	var logs logBuf
	var pingErr, settingsErr atomic.Pointer[error]
	var settingsCalls atomic.Int32
	load := func(p *atomic.Pointer[error]) error {
		if e := p.Load(); e != nil {
			return *e
		}
		return nil
	}
	set := func(p *atomic.Pointer[error], err error) { p.Store(&err) }
	evicts := errors.New(`redisstore: maxmemory-policy is "allkeys-lru", ...`)
	srv := server.New(server.Config{
		Limiter: countlimit.New(store),
		Rules:   rulesFor(t),
		Logger:  slog.New(slog.NewJSONHandler(&logs, nil)),
		Ping:    func(context.Context) error { return load(&pingErr) },
		Settings: func(context.Context) error {
			settingsCalls.Add(1)
			return load(&settingsErr)
		},
	})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := api{t, ts.URL}
	steps := []struct {
		ping, settings error
		code           int
		reason         string
		calls          int32 // Settings calls so far
	}{
		{nil, nil, 200, "", 1},
		{nil, evicts, 503, evicts.Error(), 2},
		{nil, evicts, 503, evicts.Error(), 3},
		{errors.New("connection refused"), evicts, 503, "the store failed a ping", 3},
		{nil, nil, 200, "", 4},
	}
	for i, st := range steps {
		set(&pingErr, st.ping)
		set(&settingsErr, st.settings)
		code, out := a.do("GET", "/healthz", "")
		if code != st.code || (st.reason != "" && out["reason"] != st.reason) {
			t.Errorf("step %d: healthz = %d %v, want %d with reason %q", i, code, out, st.code, st.reason)
		}
		if n := settingsCalls.Load(); n != st.calls {
			t.Errorf("step %d: Settings called %d times, want %d", i, n, st.calls)
		}
		if st.settings != nil && st.ping == nil {
			if code, out := a.do("POST", "/v1/allow", `{"rule": "sms.code", "id": "settings"}`); code != 200 {
				t.Errorf("step %d: allow = %d %v, want 200: checks go on", i, code, out)
			}
		}
	}
	if n := logs.count("store unavailable"); n != 1 {
		t.Errorf("logged %d outage lines, want 1 (the failed ping alone):\n%s", n, logs.b.String())
	}
}

// TestHealthzStoreWarnings: Config.Warnings are listed under "warnings"
// and keep /healthz at 200; beside a failing Settings they go with the
// 503; a ping that fails asks for none; none, and the field is left out.
// It is not an outage: nothing is logged.
func TestHealthzStoreWarnings(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { store.Close() })
	var logs logBuf
	var pingErr, settingsErr atomic.Pointer[error]
	var warnings atomic.Pointer[[]string]
	var warningsCalls atomic.Int32
	load := func(p *atomic.Pointer[error]) error {
		if e := p.Load(); e != nil {
			return *e
		}
		return nil
	}
	set := func(p *atomic.Pointer[error], err error) { p.Store(&err) }
	const forgets = `redisstore: Redis persists nothing (appendonly no, save ""): ...`
	evicts := errors.New(`redisstore: maxmemory-policy is "allkeys-lru", ...`)
	srv := server.New(server.Config{
		Limiter:  countlimit.New(store),
		Rules:    rulesFor(t),
		Logger:   slog.New(slog.NewJSONHandler(&logs, nil)),
		Ping:     func(context.Context) error { return load(&pingErr) },
		Settings: func(context.Context) error { return load(&settingsErr) },
		Warnings: func(context.Context) []string {
			warningsCalls.Add(1)
			return *warnings.Load()
		},
	})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	a := api{t, ts.URL}
	steps := []struct {
		ping, settings error
		warnings       []string
		code           int
		calls          int32 // Warnings calls so far
	}{
		{nil, nil, nil, 200, 1},
		{nil, nil, []string{forgets}, 200, 2},
		{nil, nil, []string{forgets, "another"}, 200, 3},
		{nil, evicts, []string{forgets}, 503, 4},
		{errors.New("connection refused"), nil, []string{forgets}, 503, 4},
		{nil, nil, []string{forgets}, 200, 5},
		{nil, nil, nil, 200, 6},
	}
	for i, st := range steps {
		set(&pingErr, st.ping)
		set(&settingsErr, st.settings)
		warnings.Store(&st.warnings)
		code, out := a.do("GET", "/healthz", "")
		want := st.warnings
		if st.ping != nil {
			want = nil
		}
		var got []string
		if list, ok := out["warnings"].([]any); ok {
			for _, w := range list {
				s, _ := w.(string)
				got = append(got, s)
			}
		}
		if _, present := out["warnings"]; code != st.code || !slices.Equal(got, want) || present != (len(want) > 0) {
			t.Errorf("step %d: healthz = %d %v, want %d with warnings %q", i, code, out, st.code, want)
		}
		if n := warningsCalls.Load(); n != st.calls {
			t.Errorf("step %d: Warnings called %d times, want %d", i, n, st.calls)
		}
	}
	if n := logs.count("store unavailable"); n != 1 {
		t.Errorf("logged %d outage lines, want 1 (the failed ping alone):\n%s", n, logs.b.String())
	}
}
