package cli_test

import (
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/service/cli"
)

// TestBadStoreURLsKeepTheirSecrets: a --store URL its driver rejects is
// reported without its password. go-redis's parse errors quote the URL as
// given, and pgx masks passwords only as well as a broken URL lets it.
func TestBadStoreURLsKeepTheirSecrets(t *testing.T) {
	for _, tc := range []struct {
		url    string
		secret string // must not appear
		reason string // what the error must still say
	}{
		{"redis://user:s3cret@host:badport/0", "s3cret", `invalid port ":badport" after host`},
		{"redis://user:s3cr%zzet@host/0", "s3cr", `invalid URL escape "%zz"`},
		{"rediss://:s3cret@host/0?password=s3cret&dial_timeout=x", "s3cret", "redis: "},
		{"unix://user:s3cret@/tmp/redis.sock?nope=1", "s3cret", "unexpected option: nope"},
		{"postgres://u:s3cret@h:notaport/db", "s3cret", "invalid port"},
		{"postgresql://u:s3cret@h/db?sslpassword=s3cret&sslmode=bogus", "s3cret", "sslmode is invalid"},
		// pgx's masking stops at the first @ of a password that should
		// have been written %40.
		{"postgres://u:s3cr@t9x@h:notaport/db", "t9x", "invalid port"},
	} {
		var cmds [][]string
		for _, c := range [][]string{
			{"allow", "sms.code", "x"},
			{"peek", "sms.code", "x"},
			{"reset", "sms.code", "x"},
			{"bench", "--duration", "1ms"},
			{"serve", "--addr", "127.0.0.1:0"},
		} {
			cmds = append(cmds, append(c, "--store", tc.url))
		}
		if strings.HasPrefix(tc.url, "postgres") {
			cmds = append(cmds,
				[]string{"top", "--store", tc.url},
				[]string{"purge", "--store", tc.url},
				[]string{"migrate", "up", "--store", tc.url},
				[]string{"bench", "--baseline", "--duration", "1ms", "--store", tc.url},
				[]string{"serve", "--addr", "127.0.0.1:0", "--migrate", "--store", tc.url})
		}
		for _, args := range cmds {
			code, stdout, stderr := run(t, args...)
			if code != cli.ExitError {
				t.Errorf("%q: exit %d, want %d", args, code, cli.ExitError)
			}
			msg, _, _ := strings.Cut(stderr, "\n")
			if strings.Contains(stderr+stdout, tc.secret) {
				t.Errorf("%q: output shows the password:\n%s%s", args, stdout, stderr)
			}
			if !strings.Contains(msg, tc.reason) {
				t.Errorf("%q: error %q does not say %q", args, msg, tc.reason)
			}
		}
	}
}
