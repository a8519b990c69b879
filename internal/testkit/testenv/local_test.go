package testenv

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fake serves each connection with answer, after reading what the client
// sends first.
func fake(t *testing.T, answer func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				answer(c)
			}()
		}
	}()
	return ln.Addr().String()
}

func TestProbePostgres(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer []byte // after the startup message
		want   string // "" for a server the tests can use
	}{
		{"trust", []byte{'R', 0, 0, 0, 8, 0, 0, 0, 0}, ""},
		{"password", []byte{'R', 0, 0, 0, 12, 0, 0, 0, 10}, "asks the postgres user for a password"},
		{"refused", []byte{'E', 0, 0, 0, 9, 'S', 'F', 'A', 'T'}, "refused the postgres user"},
		{"not postgres", []byte("HTTP/1.1 400"), "did not answer as PostgreSQL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fake(t, func(c net.Conn) {
				var n [4]byte
				if _, err := io.ReadFull(c, n[:]); err != nil {
					return
				}
				size := int(n[0])<<24 | int(n[1])<<16 | int(n[2])<<8 | int(n[3])
				if _, err := io.ReadFull(c, make([]byte, size-4)); err != nil {
					return
				}
				c.Write(tc.answer)
			})
			err := probePostgres(addr)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("probePostgres = %v, want %q", err, tc.want)
			}
		})
	}
	if err := probePostgres(closedPort(t)); err == nil || !strings.Contains(err.Error(), "nothing answers") {
		t.Errorf("probePostgres of a closed port = %v", err)
	}
}

func TestProbeRedis(t *testing.T) {
	for answer, want := range map[string]string{
		"+PONG\r\n":                            "",
		"-NOAUTH Authentication required.\r\n": "answered PING with",
	} {
		addr := fake(t, func(c net.Conn) {
			if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
				c.Write([]byte(answer))
			}
		})
		err := probeRedis(addr)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("probeRedis answered %q = %v, want %q", answer, err, want)
		}
	}
	if err := probeRedis(closedPort(t)); err == nil || !strings.Contains(err.Error(), "nothing answers") {
		t.Errorf("probeRedis of a closed port = %v", err)
	}
}

// closedPort returns an address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestSkippedNotice(t *testing.T) {
	var b strings.Builder
	writeSkipped(&b, map[string]error{"Redis": errors.New("nothing answers on 127.0.0.1:6379")})
	for _, want := range []string{"SKIPPED", "Redis: nothing answers", EnvPostgres, EnvRedis, EnvRequire + "=1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the notice lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "PostgreSQL:") {
		t.Errorf("the notice names PostgreSQL, which was not skipped:\n%s", b.String())
	}
}

// TestClaimNotice: one notice per run, and marks older than a day are
// removed, whatever run left them.
func TestClaimNotice(t *testing.T) {
	dir, now := t.TempDir(), time.Now()
	mark := func(name string, age time.Duration) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
		return path
	}
	stale := []string{mark(noticeMark+"7", 25*time.Hour), mark(oldNoticeMark+"9", 48*time.Hour)}
	fresh := mark(noticeMark+"8", time.Hour)
	other := mark("countlimit-something-else", 48*time.Hour)

	if !claimNotice(dir, 7, now) {
		t.Error("run 7, whose mark is stale: not claimed")
	}
	if claimNotice(dir, 7, now) {
		t.Error("run 7 claimed twice")
	}
	if claimNotice(dir, 8, now) {
		t.Error("run 8, marked an hour ago: claimed again")
	}
	if _, err := os.Stat(stale[1]); !os.IsNotExist(err) {
		t.Errorf("a stale mark of the old name is still there: %v", err)
	}
	for _, path := range []string{stale[0], fresh, other} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s: %v", filepath.Base(path), err)
		}
	}
}

// TestLocalOff: the local server is taken before a container, unless
// COUNTLIMIT_TEST_LOCAL=off, which skips it without a probe.
func TestLocalOff(t *testing.T) {
	probed := 0
	mk := func() *server {
		return &server{
			what: "Fake", env: "COUNTLIMIT_TEST_FAKE_URL", imageEnv: "COUNTLIMIT_TEST_FAKE_IMAGE", defaultImage: "fake:1",
			localURL: "fake://local", local: func() error { probed++; return nil },
			start: func(context.Context, string) (string, error) { return "fake://container", nil },
		}
	}
	t.Setenv("COUNTLIMIT_TEST_FAKE_URL", "")
	if u, err := mk().lookup(); u != "fake://local" || err != nil || probed != 1 {
		t.Fatalf("lookup = %q, %v after %d probes; want the local server", u, err, probed)
	}
	t.Setenv(EnvLocal, "off")
	u, err := mk().lookup()
	if probed != 1 {
		t.Errorf("%s=off probed the local server", EnvLocal)
	}
	switch {
	case err == nil && u != "fake://container":
		t.Errorf("lookup = %q, want the container", u)
	case err != nil && !strings.Contains(err.Error(), EnvLocal+"=off"):
		t.Errorf("lookup's error %q does not say the local servers were off", err)
	}
}
