//go:build unix

// Package pgbouncer starts a private pgbouncer in front of a PostgreSQL
// server, for a test of what a connection pooler changes: in transaction
// pooling (its default here) a client's statements outside a transaction
// go to whichever server connection is free, so nothing a session keeps
// (a named prepared statement, a SET, a session advisory lock) follows the
// client. It runs the machine's own pgbouncer on a free loopback port,
// with its config in the test's temporary directory, and kills it when
// the test ends.
package pgbouncer

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisserver"
)

// Bouncer is a running pgbouncer.
type Bouncer struct {
	port     int
	database string
	user     string
}

// Start starts pgbouncer in front of the database of serverURL and waits
// until a client gets through it. Its pool_mode is transaction, with 4
// server connections (default_pool_size), fewer than a test's clients
// open, opened at start and handed out in turn (server_round_robin): so
// even a lone client's transactions run each on another connection than
// the last, one that other clients used before. settings, lines of
// pgbouncer.ini's [pgbouncer] section such as "pool_mode = session", come
// after those and override them. Clients log in as the user of serverURL with no password
// (auth_type any); pgbouncer logs in to the server as that user, with the
// URL's password if it has one. pgbouncer refuses startup parameters it
// does not know, so serverURL's runtime parameters (search_path, say) are
// set on each server connection it opens instead (connect_query), and
// again after the reset between two clients in session pooling
// (server_reset_query: DISCARD ALL's steps, then the SETs), as a role's
// or a database's settings would be.
//
// pgbouncer is killed when t ends, and its log shown if t failed. Without
// pgbouncer installed the test is skipped, or failed when backends are
// required.
func Start(t testing.TB, serverURL string, settings ...string) *Bouncer {
	t.Helper()
	bin, err := find()
	if err != nil {
		testenv.Unavailable(t, "pgbouncer (apt-get install pgbouncer)", err)
	}
	cfg, err := pgconn.ParseConfig(serverURL)
	if err != nil {
		t.Fatalf("pgbouncer: the server's URL: %v", err)
	}
	b := &Bouncer{port: testenv.FreePort(t), database: cfg.Database, user: cfg.User}
	dir := t.TempDir()
	ini, err := config(cfg, b.port, settings)
	if err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	conf := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
		t.Fatal(err)
	}
	attr := &syscall.SysProcAttr{}
	if a := redisserver.ProcAttr(); a != nil {
		*attr = *a
	}
	if os.Geteuid() == 0 {
		// pgbouncer refuses to run as root; it reads its config as the
		// user it runs as.
		cred, err := unprivileged()
		if err != nil {
			testenv.Unavailable(t, "a user other than root for pgbouncer", err)
		}
		attr.Credential = cred
		for _, d := range []string{dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	logf, err := os.Create(filepath.Join(dir, "pgbouncer.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		logf.Close()
		if t.Failed() {
			if log, err := os.ReadFile(logf.Name()); err == nil {
				lines := strings.Split(strings.TrimSpace(string(log)), "\n")
				t.Logf("pgbouncer on port %d, last lines of its log:\n%s", b.port, strings.Join(lines[max(0, len(lines)-20):], "\n"))
			}
		}
	})
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("pgbouncer on port %d", b.port), func() bool {
		select {
		case <-done: // a port taken since FreePort looked, say
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("pgbouncer exited at start:\n%s", log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, b.URL())
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		return conn.Ping(ctx) == nil
	})
	b.open(t, serverConns)
	return b
}

// serverConns is how many server connections Start opens at once: with
// server_round_robin, a client's transactions then take turns on them.
const serverConns = 4

// open has pgbouncer open n server connections: n clients each in a
// transaction at once.
func (b *Bouncer) open(t testing.TB, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var txs []pgx.Tx
	for range n {
		conn, err := pgx.Connect(ctx, b.URL())
		if err != nil {
			t.Fatalf("pgbouncer: %v", err)
		}
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		if err == nil {
			_, err = tx.Exec(ctx, "SELECT 1")
		}
		if err != nil {
			t.Fatalf("pgbouncer: %v", err)
		}
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("pgbouncer: %v", err)
		}
	}
}

// URL returns the URL of the server's database through pgbouncer, with no
// settings: a pool opened on it has pgx's defaults.
func (b *Bouncer) URL() string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(b.user),
		Host:     "127.0.0.1:" + strconv.Itoa(b.port),
		Path:     "/" + b.database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port is the port pgbouncer listens on, on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// find returns pgbouncer's path: on PATH, else where Debian installs it
// (/usr/sbin, which a user's PATH may lack).
func find() (string, error) {
	p, err := exec.LookPath("pgbouncer")
	if err == nil {
		return p, nil
	}
	if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", err
}

// unprivileged is the postgres user's credential, else nobody's.
func unprivileged() (*syscall.Credential, error) {
	var errs []string
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
}

// plain is what a value in pgbouncer.ini's connection strings, and in the
// SET of connect_query, may hold unquoted here.
var plain = regexp.MustCompile(`^[A-Za-z0-9_.,"$ -]*$`)

// config returns pgbouncer.ini for the server of cfg.
func config(cfg *pgconn.Config, port int, settings []string) (string, error) {
	db := []string{
		"host=" + cfg.Host,
		"port=" + strconv.Itoa(int(cfg.Port)),
		"dbname=" + cfg.Database,
		"user=" + cfg.User,
	}
	if cfg.Password != "" {
		if strings.ContainsAny(cfg.Password, " '\"\\\n\r") {
			return "", fmt.Errorf("the server's password has a space, quote or backslash, which pgbouncer.ini would need quoted")
		}
		db = append(db, "password="+cfg.Password)
	}
	var sets []string
	for _, name := range slices.Sorted(maps.Keys(cfg.RuntimeParams)) {
		v := cfg.RuntimeParams[name]
		if !plain.MatchString(name) || !plain.MatchString(v) || strings.Contains(name, " ") {
			return "", fmt.Errorf("runtime parameter %s=%q: only letters, digits and _ . , \" $ - and spaces are written to pgbouncer.ini here", name, v)
		}
		sets = append(sets, fmt.Sprintf("SET %s = %s", name, v))
	}
	reset := "DISCARD ALL"
	if len(sets) > 0 {
		db = append(db, "connect_query='"+strings.Join(sets, "; ")+"'")
		// What DISCARD ALL does, which cannot share a query with the
		// SETs, and then the SETs again, as a role's settings would
		// outlive RESET ALL.
		reset = "CLOSE ALL; RESET ALL; " + strings.Join(sets, "; ") +
			"; DEALLOCATE ALL; UNLISTEN *; SELECT pg_advisory_unlock_all(); DISCARD PLANS; DISCARD TEMP; DISCARD SEQUENCES"
	}
	for _, v := range db {
		if strings.ContainsAny(v, "\n\r") {
			return "", fmt.Errorf("a line break in the server's URL")
		}
	}
	lines := []string{
		"[databases]",
		cfg.Database + " = " + strings.Join(db, " "),
		"",
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = any",
		"pool_mode = transaction",
		"server_reset_query = " + reset,
		"default_pool_size = " + strconv.Itoa(serverConns),
		"server_round_robin = 1",
		"max_client_conn = 500",
		"logfile =",
		"pidfile =",
	}
	lines = append(lines, settings...)
	return strings.Join(lines, "\n") + "\n", nil
}
