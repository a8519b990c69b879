package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

func TestCheckExposure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr            string
		token, insecure bool
		refused         bool
	}{
		{"127.0.0.1:8080", false, false, false},
		{"127.1.2.3:8080", false, false, false},
		{"localhost:8080", false, false, false},
		{"LocalHost:0", false, false, false},
		{"[::1]:8080", false, false, false},
		{"[::ffff:127.0.0.1]:8080", false, false, false},
		{":8080", false, false, true},
		{"0.0.0.0:8080", false, false, true},
		{"[::]:8080", false, false, true},
		{"10.0.0.5:8080", false, false, true},
		{"[fe80::1%eth0]:8080", false, false, true},
		{"myhost:8080", false, false, true},
		{"localhost.example.com:8080", false, false, true},
		{":8080", true, false, false},
		{":8080", false, true, false},
		{"0.0.0.0:8080", true, true, false},
	} {
		err := checkExposure(tc.addr, tc.token, tc.insecure)
		if (err != nil) != tc.refused {
			t.Errorf("checkExposure(%q, token %v, insecure %v) = %v; want refused %v", tc.addr, tc.token, tc.insecure, err, tc.refused)
			continue
		}
		if err != nil {
			for _, want := range []string{tc.addr, "--token-file", "$COUNTLIMIT_TOKEN", "--insecure"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("checkExposure(%q): %q does not name %s", tc.addr, err, want)
				}
			}
		}
	}
	if err := checkExposure("8080", false, false); err == nil || !strings.Contains(err.Error(), "--addr") {
		t.Errorf("checkExposure(\"8080\") = %v, want an --addr error", err)
	}
}

func TestLoadToken(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", "from-the-file-0123456789\n")
	for _, tc := range []struct {
		env, file string
		want, err string
	}{
		{"", "", "", ""},
		{"from-the-env-0123456789", "", "from-the-env-0123456789", ""},
		{"", good, "from-the-file-0123456789", ""},
		{"from-the-env-0123456789", good, "from-the-file-0123456789", ""}, // the flag wins
		{"", file("empty", " \n"), "", "is empty"},
		{"from-the-env-0123456789", file("empty2", ""), "", "is empty"},
		{"", filepath.Join(dir, "missing"), "", "--token-file"},
		{"short", "", "", "at least 16"},
		{"", file("short", "short\n"), "", "at least 16"},
		{"with a space in the middle", "", "", "holds a space"},
		{"", file("two-lines", "0123456789abcdef\n0123456789abcdef\n"), "", "holds a space"},
		{"non-ascii-token-ünïcödé", "", "", "non-ASCII"},
	} {
		t.Setenv("COUNTLIMIT_TOKEN", tc.env)
		got, err := loadToken(tc.file)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("loadToken(%q) with $COUNTLIMIT_TOKEN=%q = %q, %v; want %q, %q", tc.file, tc.env, got, err, tc.want, tc.err)
		}
		if err != nil && tc.env != "" && strings.Contains(err.Error(), tc.env) {
			t.Errorf("loadToken's error quotes the token: %v", err)
		}
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("connect: %w", &pgconn.PgError{Code: "57P03"}), true}, // the database system is starting up
		{&pgconn.PgError{Code: "53300"}, true},                            // too many connections
		{&pgconn.PgError{Code: "08006"}, true},
		{fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01"}), false}, // bad password
		{&pgconn.PgError{Code: "3D000"}, false},                            // no such database
		{redis.ErrClosed, true},
		{proto("LOADING Redis is loading the dataset in memory"), true},
		{proto("WRONGPASS invalid username-password pair"), false},
		{proto("NOAUTH Authentication required."), false},
	} {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// proto is a Redis server's error reply.
type proto string

func (e proto) Error() string { return string(e) }
func (proto) RedisError()     {}

// TestTrimNewline: a lease key loses one trailing newline, \n or \r\n,
// and nothing else, so a binary key file keeps its bytes.
func TestTrimNewline(t *testing.T) {
	for in, want := range map[string]string{
		"key\n":     "key",
		"key\r\n":   "key",
		"key\n\n":   "key\n",
		"key\r":     "key\r",
		"key\r\r\n": "key\r",
		"key":       "key",
		"":          "",
	} {
		if got := trimNewline(in); got != want {
			t.Errorf("trimNewline(%q) = %q, want %q", in, got, want)
		}
	}
}
