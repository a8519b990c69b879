//go:build unix

// Package pgcluster starts a private PostgreSQL cluster for a test that
// needs what a shared server must not be asked for: a library loaded at
// start (shared_preload_libraries), settings that take a restart. It runs
// the machine's own server binaries (initdb, pg_ctl), as the postgres
// user when the test runs as root, since initdb refuses root.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// Cluster is a running private cluster, trusting every local connection.
type Cluster struct {
	bin  string // where initdb, pg_ctl and postgres are
	dir  string // the cluster's directory: data/, the socket, the log
	port int
	cred *syscall.Credential // the postgres user's, when running as root
}

// Bin returns the directory of initdb, pg_ctl and postgres: "pg_config
// --bindir", else the newest /usr/lib/postgresql/*/bin.
func Bin() (string, error) {
	var dirs []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(found, func(a, b string) int { return major(b) - major(a) })
	dirs = append(dirs, found...)
	for _, d := range dirs {
		ok := true
		for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
			if _, err := os.Stat(filepath.Join(d, name)); err != nil {
				ok = false
			}
		}
		if ok {
			return d, nil
		}
	}
	return "", errors.New("no initdb, pg_ctl and postgres in `pg_config --bindir` or /usr/lib/postgresql/*/bin")
}

// LibDir returns where the server in bin loads extension libraries from
// (its pg_config --pkglibdir), for a test to see whether one is installed.
func LibDir(bin string) (string, error) {
	out, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir").Output()
	if err != nil {
		return "", fmt.Errorf("pg_config --pkglibdir: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// major is the major version in /usr/lib/postgresql/<version>/bin.
func major(dir string) int {
	v, _ := strconv.Atoi(strings.SplitN(filepath.Base(filepath.Dir(dir)), ".", 2)[0])
	return v
}

// Start creates a cluster with the server binaries in bin, appends conf to
// its postgresql.conf, and starts it; the cluster is stopped and removed
// when t ends. Without the postgres user (when running as root) the test
// is skipped, or failed when backends are required.
func Start(t testing.TB, bin, conf string) *Cluster {
	t.Helper()
	c := &Cluster{bin: bin, port: testenv.FreePort(t)}
	uid, gid := -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Unavailable(t, "the postgres user (initdb refuses to run as root)", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir: its parent is root's and closed to the postgres user.
	var err error
	if c.dir, err = os.MkdirTemp("", "countlimit-pg-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(c.dir) })
	if c.cred != nil {
		if err := os.Chown(c.dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	conf = fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n%s\n", c.port, c.dir, conf)
	f, err := os.OpenFile(filepath.Join(c.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(c.logFile()); err == nil {
				t.Logf("the cluster's log:\n%s", log)
			}
		}
		if err := c.run("pg_ctl", "stop", "-D", c.data(), "-w", "-m", "immediate"); err != nil {
			t.Logf("stopping PostgreSQL: %v", err)
		}
	})
	c.Ctl(t, "start")
	return c
}

// Ctl runs pg_ctl start, stop or restart (with args such as "-m", "fast")
// and waits for it to finish: a test's outage or restart.
func (c *Cluster) Ctl(t testing.TB, action string, args ...string) {
	t.Helper()
	args = append([]string{action, "-D", c.data(), "-w", "-t", "60"}, args...)
	if action != "stop" {
		args = append(args, "-l", c.logFile())
	}
	if err := c.run("pg_ctl", args...); err != nil {
		t.Fatal(err)
	}
}

// URL returns the URL of database on the cluster, as the postgres user.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, database)
}

// SocketDir is the directory of the cluster's Unix socket.
func (c *Cluster) SocketDir() string { return c.dir }

func (c *Cluster) data() string    { return filepath.Join(c.dir, "data") }
func (c *Cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

// run runs one of the server's programs as the postgres user.
func (c *Cluster) run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	// The postmaster pg_ctl leaves running must not hold our pipes open.
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}
