package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// logLines returns serve's JSON log lines whose msg is msg.
func logLines(t *testing.T, stderr, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(stderr, "\n") {
		if !strings.Contains(line, `"msg":"`+msg+`"`) {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestServePurges: serve on PostgreSQL purges expired rows and leases in
// the background, pass after pass, keeps the live ones, logs one line per
// pass and counts the rows in /metrics.
func TestServePurges(t *testing.T) {
	t.Parallel()
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatal(stderr)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// What must go was written two hours ago, what must stay now.
	want := testbackend.SeedPurge(t, pool, "", func() time.Time { return time.Now().Add(-2 * time.Hour) }, time.Now)

	s := launch(t, "--store", url, "--purge-interval", "200ms", "--purge-batch", "7")
	kept, keptLeases := testbackend.PurgeKept("")
	var rows, leases []string
	poll(t, "the expired rows and leases to go, and the live ones to stay", func() bool {
		rows, leases = testbackend.PurgeLeft(t, pool)
		return slices.Equal(rows, kept) && slices.Equal(leases, keptLeases)
	}, func() string { return fmt.Sprintf("rows %v, leases %v left", rows, leases) })
	var metrics string
	poll(t, "/metrics to count them", func() bool {
		_, out, _ := request(t, "GET", s.base+"/metrics", "", "")
		metrics, _ = out["text"].(string)
		return strings.Contains(metrics, fmt.Sprintf("countlimit_purged_rows_total %d\n", want))
	}, func() string { return metrics })
	for _, m := range []string{"countlimit_purge_passes_total", "countlimit_purge_last_success_timestamp_seconds"} {
		if !strings.Contains(metrics, m+" ") || strings.Contains(metrics, m+" 0\n") {
			t.Errorf("/metrics: %s missing or 0:\n%s", m, metrics)
		}
	}
	if !strings.Contains(metrics, "countlimit_purge_failures_total 0\n") {
		t.Errorf("/metrics: failed purges:\n%s", metrics)
	}
	poll(t, "a pass after the one that purged", func() bool {
		return len(logLines(t, s.stderr.String(), "purged expired rows")) >= 2
	}, s.stderr.String)
	if code := s.stop(); code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
	logs := s.stderr.String()
	var total float64
	passes := logLines(t, logs, "purged expired rows")
	for _, p := range passes {
		n, _ := p["rows"].(float64)
		total += n
		if p["level"] != "INFO" || p["batches"] == nil || p["took"] == nil {
			t.Errorf("purge log line %v: want level INFO, rows, batches and took", p)
		}
	}
	if len(passes) < 2 || total != float64(want) {
		t.Errorf("%d purge log lines with %v rows in all; want several and %d:\n%s", len(passes), total, want, logs)
	}
	if serving := logLines(t, logs, "serving"); len(serving) != 1 || serving[0]["purge_interval"] != "200ms" {
		t.Errorf("the serving line does not say the purge interval: %v", serving)
	}
}

// TestServePurgeOff: --purge-interval 0 turns the purge off, and a store
// that expires its own keys ignores the flag, saying so.
func TestServePurgeOff(t *testing.T) {
	t.Parallel()
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatal(stderr)
	}
	s := launch(t, "--store", url, "--purge-interval", "0")
	if _, out, _ := request(t, "GET", s.base+"/metrics", "", ""); strings.Contains(out["text"].(string), "countlimit_purge") {
		t.Errorf("--purge-interval 0: /metrics shows purge metrics")
	}
	s.stop()
	if logs := s.stderr.String(); strings.Contains(logs, "purge") {
		t.Errorf("--purge-interval 0: the log mentions purging:\n%s", logs)
	}

	s = launch(t, "--purge-interval", "1m")
	s.stop()
	if lines := logLines(t, s.stderr.String(), "--purge-interval is ignored: memory counters expire on their own"); len(lines) != 1 {
		t.Errorf("memory store with --purge-interval: no note that it is ignored:\n%s", s.stderr.String())
	}
	s = launch(t)
	s.stop()
	if logs := s.stderr.String(); strings.Contains(logs, "purge") {
		t.Errorf("memory store: the log mentions purging unasked:\n%s", logs)
	}
}

// poll checks cond until it holds or a generous deadline passes: only the
// outcome is asserted, never how soon, for the machine may be loaded. On
// failure it says what state tells.
func poll(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s: %s", what, state())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
