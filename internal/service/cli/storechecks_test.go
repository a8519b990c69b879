package cli_test

import (
	"strings"
	"testing"

	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisproxy"
)

// TestServeRedisEvictionPolicy runs the service on the test Redis behind a
// proxy that answers CONFIG GET maxmemory-policy as the case says: an
// evicting policy is logged at start and keeps /healthz at 503 with a
// reason naming it, while checks go on; a server that refuses CONFIG is
// said once to be unchecked, and stays healthy.
func TestServeRedisEvictionPolicy(t *testing.T) {
	t.Parallel()
	url := testbackend.RedisURL(t)
	const unchecked = `"msg":"could not check Redis's maxmemory-policy`
	for _, tc := range []struct {
		name   string
		answer redisproxy.Answer
		evicts bool
	}{
		{"allkeys-lru", redisproxy.ConfigGet(map[string]string{"maxmemory-policy": "allkeys-lru"}), true},
		{"volatile-lru", redisproxy.ConfigGet(map[string]string{"maxmemory-policy": "volatile-lru"}), true},
		{"noeviction", redisproxy.ConfigGet(map[string]string{"maxmemory-policy": "noeviction"}), false},
		{"refused", redisproxy.RefuseConfig("ERR unknown command 'CONFIG', with args beginning with: 'GET' 'maxmemory-policy'"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy := redisproxy.Start(t, url, tc.answer)
			s := launch(t, "--store", proxy.URL())
			atStart := s.stderr.String()
			for i := range 3 {
				code, out, _ := request(t, "GET", s.base+"/healthz", "", "")
				reason, _ := out["reason"].(string)
				if tc.evicts && (code != 503 || !strings.Contains(reason, "maxmemory-policy") || !strings.Contains(reason, tc.name)) {
					t.Errorf("step %d: healthz = %d %v, want 503 with a reason naming maxmemory-policy %s", i, code, out, tc.name)
				}
				if !tc.evicts && code != 200 {
					t.Errorf("step %d: healthz = %d %v, want 200", i, code, out)
				}
				if code, out, _ := request(t, "POST", s.base+"/v1/allow", `{"rule": "sms.code", "id": "policy-`+tc.name+`"}`, ""); code != 200 {
					t.Errorf("step %d: allow = %d %v, want 200: checks go on", i, code, out)
				}
			}
			if code := s.stop(); code != cli.ExitOK {
				t.Errorf("exit %d", code)
			}
			logs := s.stderr.String()
			policyLines := 0
			for line := range strings.Lines(logs) {
				if strings.Contains(line, "maxmemory-policy") && strings.Contains(line, tc.name) && strings.Contains(line, `"level":"ERROR"`) {
					policyLines++
				}
			}
			switch {
			case tc.evicts && (!strings.Contains(atStart, "maxmemory-policy") || policyLines != 1):
				t.Errorf("%d error lines naming maxmemory-policy %s, want 1, logged at start:\n%s", policyLines, tc.name, logs)
			case !tc.evicts && policyLines != 0:
				t.Errorf("an error line about maxmemory-policy %s:\n%s", tc.name, logs)
			}
			want := 0
			if tc.name == "refused" {
				want = 1
			}
			if n := strings.Count(logs, unchecked); n != want || (want == 1 && !strings.Contains(atStart, unchecked)) {
				t.Errorf("%d lines saying the policy could not be checked, want %d at start:\n%s", n, want, logs)
			}
			if n := strings.Count(logs, `"msg":"store unavailable"`); n != 0 {
				t.Errorf("an evicting policy was logged as an outage:\n%s", logs)
			}
		})
	}
}

// TestServeRedisPersistence runs the service on the test Redis behind a
// proxy that answers CONFIG GET appendonly and save as the case says: a
// server that persists nothing is logged at start as a warning and listed
// under /healthz's "warnings", which stays 200, unless
// --require-redis-persistence makes it a 503 with the same text as the
// reason; AOF or snapshots say nothing; a server that refuses CONFIG is
// said once to be unchecked, and stays healthy, required or not. Checks
// go on in every case.
func TestServeRedisPersistence(t *testing.T) {
	t.Parallel()
	url := testbackend.RedisURL(t)
	const unchecked = `"msg":"could not check Redis's persistence`
	answer := func(appendonly, save string) redisproxy.Answer {
		return redisproxy.ConfigGet(map[string]string{"maxmemory-policy": "noeviction", "appendonly": appendonly, "save": save})
	}
	for _, tc := range []struct {
		name     string
		answer   redisproxy.Answer
		required bool
		none     bool // persists nothing
		refused  bool
	}{
		{name: "nothing", answer: answer("no", ""), none: true},
		{name: "AOF", answer: answer("yes", "")},
		{name: "snapshots", answer: answer("no", "3600 1 300 100 60 10000")},
		{name: "refused", answer: redisproxy.RefuseConfig("ERR unknown command 'CONFIG', with args beginning with: 'GET' 'appendonly'"), refused: true},
		{name: "nothing, required", answer: answer("no", ""), required: true, none: true},
		{name: "AOF, required", answer: answer("yes", ""), required: true},
		{name: "refused, required", answer: redisproxy.RefuseConfig("ERR unknown command 'CONFIG', with args beginning with: 'GET' 'appendonly'"), required: true, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy := redisproxy.Start(t, url, tc.answer)
			args := []string{"--store", proxy.URL()}
			if tc.required {
				args = append(args, "--require-redis-persistence")
			}
			s := launch(t, args...)
			atStart := s.stderr.String()
			for i := range 3 {
				code, out, _ := request(t, "GET", s.base+"/healthz", "", "")
				warnings, _ := out["warnings"].([]any)
				reason, _ := out["reason"].(string)
				switch {
				case tc.none && tc.required:
					if code != 503 || reason != redisstore.ErrNoPersistence.Error() || out["warnings"] != nil {
						t.Errorf("step %d: healthz = %d %v, want 503 with ErrNoPersistence's text as the reason, no warnings", i, code, out)
					}
				case tc.none:
					if code != 200 || len(warnings) != 1 || warnings[0] != redisstore.ErrNoPersistence.Error() {
						t.Errorf("step %d: healthz = %d %v, want 200 with ErrNoPersistence's text as the one warning", i, code, out)
					}
				default:
					if code != 200 || out["warnings"] != nil {
						t.Errorf("step %d: healthz = %d %v, want 200 without warnings", i, code, out)
					}
				}
				if code, out, _ := request(t, "POST", s.base+"/v1/allow", `{"rule": "sms.code", "id": "persistence-`+tc.name+`"}`, ""); code != 200 {
					t.Errorf("step %d: allow = %d %v, want 200: checks go on", i, code, out)
				}
			}
			if code := s.stop(); code != cli.ExitOK {
				t.Errorf("exit %d", code)
			}
			logs := s.stderr.String()
			level := `"level":"WARN"`
			if tc.required {
				level = `"level":"ERROR"`
			}
			found := 0
			for line := range strings.Lines(logs) {
				if strings.Contains(line, `"msg":"Redis persists nothing`) {
					found++
					if !strings.Contains(line, level) {
						t.Errorf("logged %s, want it at %s", line, level)
					}
				}
			}
			switch {
			case tc.none && (found != 1 || !strings.Contains(atStart, `"msg":"Redis persists nothing`)):
				t.Errorf("%d lines saying Redis persists nothing, want 1, logged at start:\n%s", found, logs)
			case !tc.none && found != 0:
				t.Errorf("%d lines saying Redis persists nothing, want none:\n%s", found, logs)
			}
			want := 0
			if tc.refused {
				want = 1
			}
			if n := strings.Count(logs, unchecked); n != want || (want == 1 && !strings.Contains(atStart, unchecked)) {
				t.Errorf("%d lines saying persistence could not be checked, want %d at start:\n%s", n, want, logs)
			}
			if n := strings.Count(logs, `"msg":"store unavailable"`); n != 0 {
				t.Errorf("a server persisting nothing was logged as an outage:\n%s", logs)
			}
		})
	}
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		s := launch(t, "--store", "memory", "--require-redis-persistence")
		if code, out, _ := request(t, "GET", s.base+"/healthz", "", ""); code != 200 || out["warnings"] != nil {
			t.Errorf("healthz = %d %v, want 200 without warnings", code, out)
		}
		if code := s.stop(); code != cli.ExitOK {
			t.Errorf("exit %d", code)
		}
		if logs := s.stderr.String(); !strings.Contains(logs, `"msg":"--require-redis-persistence is ignored: the store is not Redis`) {
			t.Errorf("no line saying --require-redis-persistence is ignored:\n%s", logs)
		}
	})
}
