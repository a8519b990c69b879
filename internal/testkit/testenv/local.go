package testenv

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// The servers looked for on their default local ports when the URL
// variables are unset, before any container: a PostgreSQL that lets the
// postgres user in without a password, and a Redis that answers PING.
const (
	LocalPostgresURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	LocalRedisURL    = "redis://127.0.0.1:6379/0"
)

// probeTimeout bounds each look at a local port.
const probeTimeout = 2 * time.Second

// localPostgres reports whether LocalPostgresURL takes connections: it
// sends PostgreSQL's startup message and reads the server's first answer,
// which is AuthenticationOk when the postgres user needs no password. (No
// driver: testenv imports none.)
func localPostgres() error { return probePostgres("127.0.0.1:5432") }

func probePostgres(addr string) error {
	c, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return fmt.Errorf("nothing answers on %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(probeTimeout))
	var body bytes.Buffer
	_ = binary.Write(&body, binary.BigEndian, int32(196608)) // protocol 3.0
	for _, s := range []string{"user", "postgres", "database", "postgres", ""} {
		body.WriteString(s)
		body.WriteByte(0)
	}
	msg := binary.BigEndian.AppendUint32(nil, uint32(body.Len()+4))
	if _, err := c.Write(append(msg, body.Bytes()...)); err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	var head [9]byte // type, length, and for 'R' the authentication code
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return fmt.Errorf("%s did not answer as PostgreSQL: %w", addr, err)
	}
	switch code := binary.BigEndian.Uint32(head[5:]); {
	case head[0] == 'R' && code == 0:
		return nil
	case head[0] == 'R':
		return fmt.Errorf("PostgreSQL on %s asks the postgres user for a password (authentication method %d)", addr, code)
	case head[0] == 'E':
		return fmt.Errorf("PostgreSQL on %s refused the postgres user", addr)
	}
	return fmt.Errorf("%s did not answer as PostgreSQL (message %q)", addr, head[0])
}

// localRedis reports whether LocalRedisURL answers PING without a password.
func localRedis() error { return probeRedis("127.0.0.1:6379") }

func probeRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return fmt.Errorf("nothing answers on %s: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return fmt.Errorf("%s: %w", addr, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	switch {
	case err != nil:
		return fmt.Errorf("%s did not answer as Redis: %w", addr, err)
	case line == "+PONG\r\n":
		return nil
	}
	return fmt.Errorf("%s answered PING with %q, not as Redis", addr, line)
}

var (
	skipMu  sync.Mutex
	skipped = map[string]error{} // what -> why, for the notice
)

// skippedNotice, at the end of a test process whose tests skipped for a
// missing backend, says so where the person running the tests sees it: go
// test shows nothing of a package that passes but its "ok" line, so the
// skips' messages would stay hidden. It writes to the terminal, once per
// go command however many packages skipped: the first to finish writes,
// wherever that falls among the packages' lines, and the others see its
// mark (see claimNotice). It writes nothing where there is no terminal
// (CI, which sets COUNTLIMIT_REQUIRE_BACKENDS=1 and never skips).
func skippedNotice() {
	skipMu.Lock()
	defer skipMu.Unlock()
	if len(skipped) == 0 {
		return
	}
	tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer tty.Close()
	if !claimNotice(os.TempDir(), os.Getppid(), time.Now()) {
		return // another package of this go test run has said it
	}
	writeSkipped(tty, skipped)
}

// noticeMark prefixes the files that say a go command's run has shown the
// notice; the go command's process id follows.
const noticeMark = "countlimit-tests-skip-notice-run-"

// staleMark is how old a run's mark must be for claimNotice to remove it:
// older than any go test run, so the marks do not pile up in dir, and a
// reused process id does not find an old run's mark.
const staleMark = 24 * time.Hour

// oldNoticeMark is what marks were called before noticeMark; stale ones
// are removed as well.
const oldNoticeMark = "countlimit-tests-skipped-"

// claimNotice reports whether the notice of the go command with process id
// run is this process's to write: it creates run's mark in dir, which only
// the first caller can. It first removes the marks of runs older than
// staleMark.
func claimNotice(dir string, run int, now time.Time) bool {
	for _, prefix := range []string{noticeMark, oldNoticeMark} {
		marks, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
		for _, name := range marks {
			if fi, err := os.Lstat(name); err == nil && fi.Mode().IsRegular() && now.Sub(fi.ModTime()) > staleMark {
				_ = os.Remove(name)
			}
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, noticeMark+strconv.Itoa(run)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// writeSkipped writes the notice of skipped backends, why by what.
func writeSkipped(w io.Writer, why map[string]error) {
	fmt.Fprintf(w, "\ncountlimit tests: SKIPPED the tests that need")
	for _, what := range []string{"PostgreSQL", "Redis"} {
		if err, ok := why[what]; ok {
			fmt.Fprintf(w, "\n  %s: %v", what, err)
		}
	}
	fmt.Fprintf(w, "\n  Run them with a server: %s=%s, %s=%s (or a Docker engine),"+
		"\n  and %s=1 to fail rather than skip. (This notice is the one place go test shows it.)\n\n",
		EnvPostgres, LocalPostgresURL, EnvRedis, LocalRedisURL, EnvRequire)
}
