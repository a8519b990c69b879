package cli_test

import (
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/cli"
	"github.com/countlimit/countlimit/internal/testbackend"
	"github.com/countlimit/countlimit/internal/testenv/redisproxy"
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
