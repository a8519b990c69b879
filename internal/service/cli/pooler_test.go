//go:build unix

package cli_test

import (
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgbouncer"
)

// TestBehindPgBouncer runs migrate, allow and bench through pgbouncer in
// transaction pooling, each command a process of its own as from a shell:
// the server connections pgbouncer keeps carry over from one to the next.
func TestBehindPgBouncer(t *testing.T) {
	url := pgbouncer.Start(t, testbackend.FreshSchemaURL(t)).URL()
	migrateSteps(t, url)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatalf("migrate up: exit %d, %s", code, stderr)
	}
	for i := range 3 {
		code, out, stderr := run(t, "allow", "sms.code", "p1", "--store", url)
		want := []string{"1 of 2 used", "2 of 2 used", "denied"}[i]
		if !strings.Contains(out, want) {
			t.Fatalf("allow %d: exit %d, stdout %q, stderr %q; want %q", i+1, code, out, stderr, want)
		}
	}
	// Each bench deletes its counters at its end: on a server connection
	// an earlier bench's deleted from, five times over.
	for range 5 {
		code, out, stderr := run(t, "bench", "--store", url, "--duration", "300ms", "--callers", "4", "--ids", "16")
		if code != cli.ExitOK || strings.Contains(out+stderr, "countlimit: bench:") {
			t.Fatalf("bench: exit %d, stdout %q, stderr %q", code, out, stderr)
		}
	}
}
