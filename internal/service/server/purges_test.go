package server_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
)

// TestPurgeMetrics: with Config.Purges, /metrics counts the purge passes
// observed, the rows they deleted, the failed ones and the time they took,
// and says when one last succeeded; without it, no purge metric shows.
func TestPurgeMetrics(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	metrics := func(p *server.Purges) string {
		t.Helper()
		srv := server.New(server.Config{Limiter: countlimit.New(store), Rules: rulefile.Default(), Logger: quiet, Purges: p})
		rec := call(t, srv, "GET", "/metrics", "", "")
		if rec.Code != 200 {
			t.Fatalf("GET /metrics: %d", rec.Code)
		}
		return rec.Body.String()
	}
	if text := metrics(nil); strings.Contains(text, "countlimit_purge") {
		t.Errorf("purge metrics without Config.Purges:\n%s", text)
	}
	var p server.Purges
	if text := metrics(&p); !strings.Contains(text, "countlimit_purged_rows_total 0\n") ||
		!strings.Contains(text, "countlimit_purge_last_success_timestamp_seconds 0\n") {
		t.Errorf("purge metrics before any pass lack their zeros:\n%s", text)
	}
	before := time.Now()
	p.Observe(1000, 1500*time.Millisecond, nil)
	p.Observe(7, 500*time.Millisecond, errors.New("store down"))
	p.Observe(3, time.Second, nil)
	text := metrics(&p)
	for _, want := range []string{
		"countlimit_purged_rows_total 1010\n",
		"countlimit_purge_passes_total 3\n",
		"countlimit_purge_failures_total 1\n",
		"countlimit_purge_seconds_total 3\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, text)
		}
	}
	var last float64
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "countlimit_purge_last_success_timestamp_seconds "); ok {
			if _, err := fmt.Sscan(v, &last); err != nil {
				t.Fatal(err)
			}
		}
	}
	if last < float64(before.Unix()) || last > float64(time.Now().Unix()+1) {
		t.Errorf("countlimit_purge_last_success_timestamp_seconds = %v, want about %d", last, before.Unix())
	}
}
