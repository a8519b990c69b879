package cli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/cli"
	"github.com/countlimit/countlimit/internal/testbackend"
)

func TestMain(m *testing.M) { testbackend.Main(m) }

// run runs the command line and returns its exit status and output.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
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
	for _, args := range [][]string{{"help"}, {"serve", "-h"}, {"allow", "--help"}} {
		if code, out, _ := run(t, args...); code != cli.ExitOK || !strings.Contains(out, "migrate up|down|status") {
			t.Errorf("countlimit %v: exit %d, %q; want the usage", args, code, out)
		}
	}
	code, _, stderr := run(t, "top", "--store", "postgres://u@127.0.0.1:1/db?password=hunter2&connect_timeout=1")
	if code != cli.ExitError || strings.Contains(stderr, "hunter2") || !strings.Contains(stderr, "password=xxxxx") {
		t.Errorf("top with a password in the query: exit %d, %q", code, stderr)
	}
}

func TestMigrate(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	steps := []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "status", "--store", url}, "00001_count_limit.sql"},
		{[]string{"migrate", "status", "--store", url}, "00002_apply_locking.sql"},
		{[]string{"migrate", "status", "--store", url}, "00003_support_indexes.sql"},
		{[]string{"migrate", "up", "--store", url}, "applied 00003_support_indexes.sql"},
		{[]string{"migrate", "up", "--store", url}, "nothing to apply"},
		{[]string{"migrate", "status", "--store", url}, "applied 20"},
		{[]string{"migrate", "down", "--store", url}, "rolled back 00003_support_indexes.sql"},
		{[]string{"migrate", "down", "--store", url}, "rolled back 00002_apply_locking.sql"},
		{[]string{"migrate", "status", "--store", url}, "pending"},
		{[]string{"migrate", "down", "--store", url}, "rolled back 00001_count_limit.sql"},
		{[]string{"migrate", "down", "--store", url}, "nothing to roll back"},
	}
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
