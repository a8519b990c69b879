package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/migrations"
)

func TestMain(m *testing.M) { testbackend.Main(m) }

// run runs the command line and returns its exit status and output.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// span is when a call of the CLI ran: its clock read lies within.
type span struct{ before, after time.Time }

// timed is run, and when it ran.
func timed(t *testing.T, args ...string) (int, string, string, span) {
	t.Helper()
	before := time.Now()
	code, out, stderr := run(t, args...)
	return code, out, stderr, span{before, time.Now()}
}

var retryIn = regexp.MustCompile(`\(retry in ([^)]+)\)`)

// checkWait says how out's "retry in D" is wrong, or nil: D must be wait,
// begun during the call from, less the time the clock ran from then to
// the call at, which lies between at.before - from.after and at.after -
// from.before; to the millisecond the CLI rounds D to.
func checkWait(out string, wait time.Duration, from, at span) error {
	m := retryIn.FindStringSubmatch(out)
	if m == nil {
		return fmt.Errorf("no wait in %q", out)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		return err
	}
	lo := wait - at.after.Sub(from.before) - time.Millisecond
	hi := wait - at.before.Sub(from.after) + time.Millisecond
	if d < lo || d > hi {
		return fmt.Errorf("retry in %v, want %v to %v", d, lo, hi)
	}
	return nil
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		code    int
		wantErr string
	}{
		{nil, cli.ExitError, "Usage:"},
		{[]string{"frobnicate"}, cli.ExitError, `unknown command "frobnicate"`},
		{[]string{"migrate"}, cli.ExitError, "want up, down or status"},
		{[]string{"migrate", "sideways", "--store", "postgres://x"}, cli.ExitError, `got "sideways"`},
		{[]string{"migrate", "up", "--store", "memory"}, cli.ExitError, "must be a postgres:// URL"},
		{[]string{"migrate", "up", "--store", "redis://:hunter2@localhost"}, cli.ExitError, "must be a postgres:// URL"},
		{[]string{"migrate", "up", "--bogus"}, cli.ExitError, "flag provided but not defined: -bogus"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.wantErr) {
			t.Errorf("countlimit %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.wantErr)
		}
		if strings.Contains(stderr, "hunter2") {
			t.Errorf("countlimit %v printed a password: %q", tc.args, stderr)
		}
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		if code, out, _ := run(t, args...); code != cli.ExitOK || !strings.Contains(out, "migrate up|down|status") {
			t.Errorf("countlimit %v: exit %d, %q; want the usage", args, code, out)
		}
	}
	code, _, stderr := run(t, "top", "--store", "postgres://u@127.0.0.1:1/db?password=hunter2&connect_timeout=1")
	if code != cli.ExitError || strings.Contains(stderr, "hunter2") || !strings.Contains(stderr, "password=xxxxx") {
		t.Errorf("top with a password in the query: exit %d, %q", code, stderr)
	}
}

// TestUsageErrors: a command line a command cannot run gets one line that
// says why and one that points at the command's help, not the whole usage.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		want     string
		wantHint string
	}{
		{[]string{"frobnicate"}, `countlimit: unknown command "frobnicate"`, "run 'countlimit help' for the commands"},
		{[]string{"help", "frobnicate"}, `countlimit: help: unknown command "frobnicate"`, "run 'countlimit help' for the commands"},
		{[]string{"bench", "--store", "memory", "--callers", "1,2", "--rows", "new"}, "countlimit: bench: --rows goes with --baseline", "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--store", "memory", "--table-rows", "10"}, "countlimit: bench: --table-rows goes with --baseline --rows existing", "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--rows", "existing", "--table-rows", "0"}, "countlimit: bench --baseline: --table-rows must be from 1 to 100000000, got 0", "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--rows", "random", "--table-rows", "10"}, `countlimit: bench --baseline: --table-rows fills the tables of --rows existing alone; give --rows existing, got --rows "random"`, "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--table-rows", "10"}, `countlimit: bench --baseline: --table-rows fills the tables of --rows existing alone; give --rows existing, got --rows "existing,new"`, "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--rows", "existing", "--table-rows", "10", "--ids", "5"}, "countlimit: bench --baseline: --table-rows draws the ids from the rows it fills; give no --ids", "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--rows", "sideways"}, `countlimit: bench --baseline: --rows wants a list of existing, new and random (e.g. existing,new), got "sideways"`, "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--check", "fixed,token-bucket"}, `countlimit: bench --baseline: --check wants a list of fixed, smooth, sliding, allowall and lease, or all (e.g. fixed,smooth), got "fixed,token-bucket"`, "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--store", "memory", "--check", "smooth"}, "countlimit: bench: --check goes with --baseline", "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--rows", "existing", "--table-rows", "10", "--check", "sliding"}, `countlimit: bench --baseline: --table-rows fills the tables with fixed-window rows; it goes with --check fixed alone, got --check "sliding"`, "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--baseline", "--store", "memory", "--check", "all", "--plot", "x.svg"}, `countlimit: bench --baseline: --plot draws one kind of check; give --check one kind, got "all"`, "run 'countlimit bench -h' for its flags"},
		{[]string{"allow", "sms.code"}, "countlimit: allow: want RULE ID, got 1 argument", "run 'countlimit allow -h' for its flags"},
		{[]string{"peek"}, "countlimit: peek: want RULE ID, got 0 arguments", "run 'countlimit peek -h' for its flags"},
		{[]string{"bench", "--bogus"}, "countlimit: bench: flag provided but not defined: -bogus", "run 'countlimit bench -h' for its flags"},
		{[]string{"bench", "--duration", "soon"}, `countlimit: bench: invalid value "soon" for flag -duration`, "run 'countlimit bench -h' for its flags"},
		{[]string{"serve", "extra"}, `countlimit: serve: unexpected argument "extra"`, "run 'countlimit serve -h' for its flags"},
		{[]string{"top", "-n", "0"}, "countlimit: top: -n must be at least 1, got 0", "run 'countlimit top -h' for its flags"},
		{[]string{"migrate", "sideways"}, `countlimit: migrate: want up, down or status, got "sideways"`, "run 'countlimit migrate -h' for its flags"},
		{[]string{"rules", "lint"}, `countlimit: rules: want check FILE or default, got "lint"`, "run 'countlimit rules -h' for its usage"},
		{[]string{"version", "extra"}, `countlimit: version: takes no arguments, got "extra"`, "run 'countlimit version -h' for its usage"},
	} {
		code, out, stderr := run(t, tc.args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != cli.ExitError || out != "" || len(lines) != 2 || !strings.HasPrefix(lines[0], tc.want) || lines[1] != tc.wantHint {
			t.Errorf("countlimit %q: exit %d, stdout %q, stderr:\n%s\nwant exit 2, %q and then %q", tc.args, code, out, stderr, tc.want, tc.wantHint)
		}
	}
}

// TestHelp: "countlimit CMD -h" (and "countlimit help CMD") prints how CMD
// is called and every one of its flags, and exits 0.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		cmd   string
		usage string
		flags []string
	}{
		{"serve", "countlimit serve [flags]", []string{"--addr ADDR", "--store URL", "--rules FILE", "--migrate", "--token-file FILE", "--insecure",
			"--metrics-addr ADDR", "--log-level LEVEL", "--store-timeout duration", "--breaker-failures N", "--breaker-cooldown duration", "--max-conns N",
			"--purge-interval duration", "--purge-batch N", "countlimit purge"}},
		{"allow", "countlimit allow RULE ID --store URL [flags]", []string{"--store URL", "--rules FILE", "--cost N", "--tier T", "--json"}},
		{"peek", "countlimit peek RULE ID", []string{"--store URL", "--tier T", "--json"}},
		{"refund", "countlimit refund RULE ID", []string{"--cost N", "Exit status: 0 once refunded"}},
		{"reset", "countlimit reset RULE ID", []string{"--store URL", "it needs no tier"}},
		{"top", "countlimit top --store postgres://... [flags]", []string{"--store URL", "-n N", "--json"}},
		{"purge", "countlimit purge --store postgres://... [flags]", []string{"--store URL", "--batch N"}},
		{"migrate", "countlimit migrate up|down|status --store postgres://...", []string{"--store URL"}},
		{"bench", "countlimit bench --store URL [flags]", []string{"--store URL", "--rules FILE", "--rule NAME", "--tier T", "--duration duration",
			"--callers LIST", "--ids N", "--baseline", "--check LIST", "--rows LIST", "--table-rows N", "--json", "--csv", "--plot FILE.svg"}},
		{"rules", "countlimit rules check FILE", []string{"countlimit rules default"}},
		{"version", "countlimit version", []string{"VCS revision"}},
	} {
		for _, args := range [][]string{{tc.cmd, "-h"}, {tc.cmd, "--help"}, {"help", tc.cmd}} {
			code, out, stderr := run(t, args...)
			if code != cli.ExitOK || stderr != "" || !strings.HasPrefix(out, "Usage:\n  "+tc.usage) || strings.Contains(out, "countlimit help [COMMAND]") {
				t.Errorf("countlimit %q: exit %d, stderr %q, stdout:\n%s\nwant exit 0 and %q's own help", args, code, stderr, out, tc.cmd)
				continue
			}
			for _, f := range tc.flags {
				if !strings.Contains(out, f) {
					t.Errorf("countlimit %q does not mention %q:\n%s", args, f, out)
				}
			}
		}
	}
	// Flags after the positional arguments ask for help too.
	if code, out, _ := run(t, "allow", "sms.code", "x", "-h"); code != cli.ExitOK || !strings.Contains(out, "--tier T") {
		t.Errorf("allow sms.code x -h: exit %d, %q", code, out)
	}
	for _, args := range [][]string{{"help", "-h"}, {"help", "--help"}, {"-h"}} {
		if code, out, stderr := run(t, args...); code != cli.ExitOK || stderr != "" || !strings.Contains(out, "countlimit help [COMMAND]") {
			t.Errorf("countlimit %q: exit %d, stderr %q; want exit 0 and the usage", args, code, stderr)
		}
	}
	// The help never shows $COUNTLIMIT_STORE's value: it may hold a password.
	t.Setenv("COUNTLIMIT_STORE", "postgres://u:hunter2@db/app")
	if _, out, _ := run(t, "bench", "-h"); strings.Contains(out, "hunter2") {
		t.Errorf("bench -h shows $COUNTLIMIT_STORE:\n%s", out)
	}
}

// TestStoreRequired: every command but serve needs a store named, with
// --store or $COUNTLIMIT_STORE; without either it says so in one line.
func TestStoreRequired(t *testing.T) {
	t.Setenv("COUNTLIMIT_STORE", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"allow", "sms.code", "18500000000"}, "countlimit: allow: no store: pass --store postgres://... or redis://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"allow", "a", "b"}, "countlimit: allow: no store: pass --store postgres://... or redis://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"peek", "sms.code", "x"}, "countlimit: peek: no store: pass --store postgres://... or redis://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"refund", "sms.code", "x"}, "countlimit: refund: no store: pass --store postgres://... or redis://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"reset", "sms.code", "x"}, "countlimit: reset: no store: pass --store postgres://... or redis://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"top"}, "countlimit: top: no store: pass --store postgres://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"purge"}, "countlimit: purge: no store: pass --store postgres://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"migrate", "up"}, "countlimit: migrate: no store: pass --store postgres://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"bench"}, "countlimit: bench: no store: pass --store memory, postgres://... or redis://..., or set $COUNTLIMIT_STORE\n"},
		{[]string{"bench", "--baseline"}, "countlimit: bench: no store: pass --store memory, postgres://... or redis://..., or set $COUNTLIMIT_STORE\n"},
	} {
		code, out, stderr := run(t, tc.args...)
		if code != cli.ExitError || out != "" || stderr != tc.want {
			t.Errorf("countlimit %q with no store: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, stderr, tc.want)
		}
	}
	// Memory forgets at exit: the one-shot commands refuse it, however named.
	for _, env := range []string{"", "memory"} {
		t.Setenv("COUNTLIMIT_STORE", env)
		args := []string{"allow", "sms.code", "x"}
		if env == "" {
			args = append(args, "--store", "memory")
		}
		code, _, stderr := run(t, args...)
		if code != cli.ExitError || !strings.Contains(stderr, "--store memory would forget the count when the command exits") {
			t.Errorf("countlimit %q with COUNTLIMIT_STORE=%q: exit %d, %q", args, env, code, stderr)
		}
	}
	// bench takes memory when it is named.
	t.Setenv("COUNTLIMIT_STORE", "memory")
	if code, out, stderr := run(t, "bench", "--duration", "20ms", "--concurrency", "1"); code != cli.ExitOK || !strings.Contains(out, "store memory") {
		t.Errorf("bench with COUNTLIMIT_STORE=memory: exit %d, %q %q", code, out, stderr)
	}
}

func TestVersion(t *testing.T) {
	code, out, stderr := run(t, "version")
	if code != cli.ExitOK || !strings.HasPrefix(out, "countlimit ") || !strings.Contains(out, "\n  go       go1.") {
		t.Errorf("version: exit %d, %q %q", code, out, stderr)
	}
	if code, out2, _ := run(t, "--version"); code != cli.ExitOK || out2 != out {
		t.Errorf("--version: exit %d, %q; want %q", code, out2, out)
	}
}

func TestMigrate(t *testing.T) { migrateSteps(t, testbackend.FreshSchemaURL(t)) }

// migrationNames are countlimit's migration files, oldest first.
func migrationNames(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) < 2 {
		t.Fatalf("migrations: %v, %v", names, err)
	}
	slices.Sort(names)
	return names
}

// migrateSteps runs migrate status, up and down on url, of a new schema.
func migrateSteps(t *testing.T, url string) {
	names := migrationNames(t)
	type step struct {
		args []string
		want string
	}
	steps := []step{
		{[]string{"migrate", "status", "--store", url}, names[0]},
		{[]string{"migrate", "status", "--store", url}, names[len(names)-1]},
		{[]string{"migrate", "status", "--store", url}, "pending"},
		{[]string{"migrate", "up", "--store", url}, "applied " + names[0]},
		{[]string{"migrate", "status", "--store", url}, "applied 20"},
		{[]string{"migrate", "up", "--store", url}, "nothing to apply"},
	}
	// down rolls back the newest migration only.
	for i := len(names) - 1; i >= 0; i-- {
		steps = append(steps, step{[]string{"migrate", "down", "--store", url}, "rolled back " + names[i]})
	}
	steps = append(steps,
		step{[]string{"migrate", "status", "--store", url}, "pending"},
		step{[]string{"migrate", "down", "--store", url}, "nothing to roll back"})
	for i, s := range steps {
		code, out, stderr := run(t, s.args...)
		if code != cli.ExitOK || !strings.Contains(out, s.want) {
			t.Fatalf("step %d: countlimit %s: exit %d, stdout %q, stderr %q; want %q", i, s.args[:2], code, out, stderr, s.want)
		}
	}
	t.Setenv("COUNTLIMIT_STORE", url)
	if code, out, stderr := run(t, "migrate", "up"); code != cli.ExitOK || !strings.Contains(out, "applied") {
		t.Fatalf("migrate up with COUNTLIMIT_STORE: exit %d, %q %q", code, out, stderr)
	}
}
