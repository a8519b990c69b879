package server_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestGroupsOfManyRules: a group of three rules (which crashed the
// handler on the memory store) and one of eight, every kind that counts
// events, answer on every store, all or nothing.
func TestGroupsOfManyRules(t *testing.T) {
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			suffix := string(storetest.UseType(t, ""))
			windows := []string{"fixed 1h", "sliding 10m", "rolling 30m", "calendar day Asia/Amman", "lifetime", "calendar week UTC", "sliding 1h", "calendar month America/Santiago"}
			var yaml strings.Builder
			yaml.WriteString("rules:\n")
			for i, w := range windows {
				fmt.Fprintf(&yaml, "  r%d: {window: %s, limit: %d, use_type: r%d%s}\n", i, w, 2+i, i, suffix)
			}
			yaml.WriteString("groups:\n  three: {rules: [r0, r1, r2]}\n  eight: {rules: [r7, r6, r5, r4, r3, r2, r1, r0]}\n")
			rules, err := rulefile.Parse("groups.yaml", []byte(yaml.String()))
			if err != nil {
				t.Fatal(err)
			}
			clock := storetest.NewClock(time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC))
			ts := httptest.NewServer(server.New(server.Config{
				Limiter: countlimit.New(b.Open(t), countlimit.WithClock(clock.Now)),
				Rules:   rules,
				Logger:  quiet,
			}))
			defer ts.Close()
			a := api{t, ts.URL}
			a.expect("/v1/allow", `{"rule": "three", "id": "u"}`, true, 0, "1/2", "1/3", "1/4")
			a.expect("/v1/allow", `{"rule": "three", "id": "u"}`, true, 0, "2/2", "2/3", "2/4")
			a.expect("/v1/allow", `{"rule": "eight", "id": "u"}`, false, 3600, "0/9", "0/8", "0/7", "0/6", "0/5", "2/4", "2/3", "2/2")
			a.expect("/v1/allow", `{"rule": "eight", "id": "v"}`, true, 0, "1/9", "1/8", "1/7", "1/6", "1/5", "1/4", "1/3", "1/2")
		})
	}
}
