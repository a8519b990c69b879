package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestSmoothRuleCommands: the CLI takes a rule file's smooth rule: rules
// check accepts it, and allow on PostgreSQL allows the burst and then
// denies, saying when one more fits (bench runs it: TestBenchSmoothRule in
// internal/service/bench).
func TestSmoothRuleCommands(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "smooth.yaml")
	if err := os.WriteFile(rules, []byte("rules:\n  api.smooth: {window: smooth 1m burst 5, limit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := run(t, "rules", "check", rules); code != cli.ExitOK || !strings.Contains(out, "1 rule and 0 groups: ok") {
		t.Errorf("rules check: exit %d, %q %q", code, out, stderr)
	}
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatal(stderr)
	}
	for i := range 5 {
		if code, out, stderr := run(t, "allow", "api.smooth", "k1", "--rules", rules, "--store", url); code != cli.ExitOK {
			t.Fatalf("allow %d of a burst of 5 on PostgreSQL: exit %d, %q %q", i+1, code, out, stderr)
		}
	}
	code, out, stderr := run(t, "allow", "api.smooth", "k1", "--rules", rules, "--store", url)
	if code != cli.ExitDenied || !strings.Contains(out, "retry in ") || !strings.Contains(out, "api.smooth: 5 of a burst of 5 not drained yet, 0 left") {
		t.Errorf("allow 6 of a burst of 5 at one a minute on PostgreSQL: exit %d, %q %q; want %d and a retry within a minute", code, out, stderr, cli.ExitDenied)
	}
}
