package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

func TestLeaseCommands(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatal(stderr)
	}
	// acquire prints the lease alone, for LEASE=$(countlimit acquire ...).
	var (
		leases []string
		first  span // the first lease's acquire: it expires first, 10m on
	)
	for i := 0; i < 3; i++ {
		code, out, stderr, at := timed(t, "acquire", "export.running", "u1", "--store", url)
		if i == 0 {
			first = at
		}
		lease := strings.TrimSuffix(out, "\n")
		if code != cli.ExitOK || !strings.HasPrefix(lease, "cl1.") || strings.ContainsAny(lease, " \n") {
			t.Fatalf("acquire %d: exit %d, stdout %q, stderr %q; want the lease", i+1, code, out, stderr)
		}
		leases = append(leases, lease)
	}
	steps := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"acquire", "export.running", "u1", "--store", url}, cli.ExitDenied, "denied: export.running for u1 (retry in "},
		{[]string{"acquire", "export.running", "u1", "--store", url}, cli.ExitDenied, "export.running: 3 of 3 used, 0 left"},
		{[]string{"acquire", "export.running", "u1", "--store", url, "--json"}, cli.ExitDenied, `"allowed": false`},
		{[]string{"peek", "export.running", "u1", "--store", url}, cli.ExitDenied, "3 of 3 used"},
		{[]string{"extend", leases[0], "--store", url}, cli.ExitOK, "extended: the lease of export.running for u1 is held for 10m0s more\n"},
		{[]string{"extend", "--store", url, leases[0], "--json"}, cli.ExitOK, `"expires_in_seconds": 600`},
		{[]string{"release", leases[0], "--store", url}, cli.ExitOK, "released: the lease of export.running for u1\n"},
		{[]string{"release", leases[0], "--store", url, "--json"}, cli.ExitOK, `"released": true`}, // idempotent
		{[]string{"extend", leases[0], "--store", url}, cli.ExitDenied, "not held: the lease of export.running for u1 expired or was released"},
		{[]string{"extend", leases[0], "--store", url, "--json"}, cli.ExitDenied, `{"extended": false}`},
		{[]string{"peek", "export.running", "u1", "--store", url}, cli.ExitOK, "2 of 3 used"},
		{[]string{"acquire", "export.running", "u1", "--store", url, "--json"}, cli.ExitOK, `"lease": "cl1.`},
	}
	for i, s := range steps {
		code, out, stderr, at := timed(t, s.args...)
		if code != s.code || !strings.Contains(out, s.want) {
			t.Errorf("step %d: countlimit %v: exit %d, stdout %q, stderr %q; want exit %d and %q", i, s.args, code, out, stderr, s.code, s.want)
		} else if i == 0 {
			if err := checkWait(out, 10*time.Minute, first, at); err != nil {
				t.Errorf("step 0: countlimit %v: %v (the first lease's 10m less the time since)", s.args, err)
			}
		}
	}
	_, out, _ := run(t, "acquire", "export.running", "u2", "--store", url, "--json")
	var resp struct {
		Allowed bool   `json:"allowed"`
		Lease   string `json:"lease"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || !resp.Allowed || resp.Lease == "" {
		t.Errorf("acquire --json: %q (%v)", out, err)
	}
	if code, _, stderr := run(t, "release", resp.Lease, "--store", url); code != cli.ExitOK {
		t.Errorf("release of the --json lease: exit %d, %q", code, stderr)
	}

	edited := []byte(leases[1])
	edited[len(edited)-1] ^= 1
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"acquire", "sms.code", "x", "--store", url}, "acquire takes a rule with a concurrent window; sms.code has sliding 5m"},
		{[]string{"acquire", "conversation.create", "x", "--store", url}, "conversation.create is a group"},
		{[]string{"acquire", "export.running", "x", "--cost", "1", "--store", url}, "acquire takes no --cost"},
		{[]string{"acquire", "export.running", "x", "--store", "memory"}, "--store memory would forget"},
		{[]string{"allow", "export.running", "x", "--store", url}, "export.running has a concurrent window: it holds slots, not events"},
		{[]string{"release", "--store", url}, "release: want LEASE (the string acquire printed), got 0 arguments"},
		{[]string{"extend", "a", "b", "--store", url}, "extend: want LEASE (the string acquire printed), got 2 arguments"},
		{[]string{"release", "x", "--store", "memory"}, "--store memory holds no lease"},
		{[]string{"release", "nope", "--store", url}, "countlimit: release: invalid argument: lease: is not a lease string"},
		{[]string{"extend", string(edited), "--store", url}, "lease: checksum does not match"},
		{[]string{"release", "x"}, "release: no store: pass --store"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("countlimit %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

func TestLeaseHelp(t *testing.T) {
	for _, tc := range []struct {
		cmd, usage string
		says       []string
	}{
		{"acquire", "countlimit acquire RULE ID --store URL [flags]", []string{"--store URL", "--rules FILE", "--tier T", "--json", "--lease-key-file FILE", "prints the lease", "1 when denied"}},
		{"release", "countlimit release LEASE --store URL [flags]", []string{"--store URL", "--json", "--lease-key-file FILE", "not an error"}},
		{"extend", "countlimit extend LEASE --store URL [flags]", []string{"--store URL", "--json", "--lease-key-file FILE", "1 when not held"}},
	} {
		for _, args := range [][]string{{tc.cmd, "-h"}, {"help", tc.cmd}} {
			code, out, stderr := run(t, args...)
			if code != cli.ExitOK || stderr != "" || !strings.HasPrefix(out, "Usage:\n  "+tc.usage) {
				t.Errorf("countlimit %q: exit %d, stderr %q, stdout:\n%s", args, code, stderr, out)
				continue
			}
			for _, s := range tc.says {
				if !strings.Contains(out, s) {
					t.Errorf("countlimit %q does not mention %q:\n%s", args, s, out)
				}
			}
		}
	}
	if code, out, _ := run(t, "help"); code != cli.ExitOK || !strings.Contains(out, "countlimit acquire RULE ID") || !strings.Contains(out, "countlimit release|extend LEASE") {
		t.Errorf("help: exit %d, usage lacks the lease commands:\n%s", code, out)
	}
}

// TestLeaseKey: with --lease-key-file (or $COUNTLIMIT_LEASE_KEY) acquire
// prints a signed lease, which release takes only with the same key.
func TestLeaseKey(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatal(stderr)
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "lease.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("too short"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, "acquire", "export.running", "u1", "--store", url, "--lease-key-file", keyFile)
	lease := strings.TrimSuffix(out, "\n")
	if code != cli.ExitOK || !strings.HasPrefix(lease, "cl2.") {
		t.Fatalf("acquire --lease-key-file: exit %d, stdout %q, stderr %q; want a signed lease", code, out, stderr)
	}
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"release", lease, "--store", url}, "", "lease: is signed, and this Limiter has no lease key"},
		{[]string{"release", lease, "--store", url}, "fedcba9876543210-another-key", "lease: signature does not match"},
		{[]string{"release", lease, "--store", url, "--lease-key-file", short}, "", "is 9 bytes long, want at least 16"},
		{[]string{"acquire", "export.running", "u1", "--store", url}, "short", "$COUNTLIMIT_LEASE_KEY is 5 bytes long"},
	} {
		t.Setenv("COUNTLIMIT_LEASE_KEY", tc.env)
		code, _, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("countlimit %v with $COUNTLIMIT_LEASE_KEY %q: exit %d, stderr %q; want exit 2 and %q", tc.args, tc.env, code, stderr, tc.want)
		}
	}
	if code, out, _ := run(t, "peek", "export.running", "u1", "--store", url); !strings.Contains(out, "1 of 3 used") {
		t.Errorf("after refused releases: exit %d, %q; want the slot still held", code, out)
	}
	// The file's key, from the environment: each loses one trailing newline.
	t.Setenv("COUNTLIMIT_LEASE_KEY", "0123456789abcdef0123456789abcdef\r\n")
	if code, out, stderr := run(t, "release", lease, "--store", url); code != cli.ExitOK || !strings.Contains(out, "released") {
		t.Errorf("release with the key: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	if code, out, _ := run(t, "peek", "export.running", "u1", "--store", url); !strings.Contains(out, "0 of 3 used") {
		t.Errorf("after the release: exit %d, %q; want no slot held", code, out)
	}
}
