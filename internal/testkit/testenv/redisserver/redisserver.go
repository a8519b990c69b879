//go:build unix

// Package redisserver starts a private redis-server for a test that needs
// what a shared server must not be asked for: settings of its own
// (persistence, say), a restart, a kill, replicas and a Sentinel. It runs
// the machine's own redis-server on a free loopback port, in a directory of
// the test's own, and kills it when the test ends.
package redisserver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// Server is a private redis-server. Its methods are for the test's own
// goroutine.
type Server struct {
	bin  string
	dir  string
	port int
	args []string
	conf string // a Sentinel's config file, else ""
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	log  *os.File
}

// Start starts redis-server with args (its settings as flags, such as
// "--save", "", "--appendonly", "no") after its port, address and
// directory, and waits until it answers PING. The server is killed when t
// ends, and its log shown if t failed. Without redis-server on PATH the
// test is skipped, or failed when backends are required.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	return start(t, "redis-server (for a private Redis)", "", args)
}

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) whose
// config file, written to its directory, holds conf, such as
// "sentinel monitor mymaster 127.0.0.1 6380 1"; args are further settings,
// as for Start. A Sentinel rewrites its config file as it learns, so a
// restart (Run) remembers what it knew. It is killed, skipped or failed as
// Start's server is.
func StartSentinel(t testing.TB, conf string, args ...string) *Server {
	t.Helper()
	return start(t, "redis-server (for a Redis Sentinel)", conf, args)
}

func start(t testing.TB, what, conf string, args []string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, what, err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), port: testenv.FreePort(t), args: args}
	if conf != "" {
		s.conf = filepath.Join(s.dir, "sentinel.conf")
		if err := os.WriteFile(s.conf, []byte(conf+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.log, err = os.Create(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Kill(t)
		s.log.Close()
		if t.Failed() {
			if b, err := os.ReadFile(s.log.Name()); err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("redis-server on %s, last lines of its log:\n%s", s.Addr(), strings.Join(lines[max(0, len(lines)-20):], "\n"))
			}
		}
	})
	s.Run(t)
	return s
}

// Addr returns the server's address, host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL returns the server's URL, database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Client returns a client on the server, closed when t ends, that never
// retries a command: across a restart, a test sees what happened.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// Run starts the server, after Kill or Stop a restart with the same
// settings, port and directory (so with what it persisted there), and
// waits until it answers PING.
func (s *Server) Run(t testing.TB) {
	t.Helper()
	if s.cmd != nil {
		t.Fatal("redisserver: Run while the server runs")
	}
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir, "--daemonize", "no"}, s.args...)
	if s.conf != "" {
		// The config file must come first, as redis-server reads it.
		args = append([]string{s.conf, "--sentinel"}, args...)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = ProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return
		}
		select {
		case <-s.done:
			s.cmd = nil
			t.Fatalf("redis-server on %s exited at start (see its log): %v", s.Addr(), err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING within 10 s: %v", s.Addr(), err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill kills the server (SIGKILL: a crash, nothing saved on the way out)
// and waits for it to exit. A server that is not running is left alone.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	s.wait(t, "SIGKILL")
}

// Stop shuts the server down cleanly (SIGTERM, which saves a snapshot
// first when the server has a save schedule) and waits for it to exit.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if s.cmd == nil {
		t.Fatal("redisserver: Stop while the server is not running")
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("redisserver: SIGTERM: %v", err)
	}
	s.wait(t, "SIGTERM")
}

func (s *Server) wait(t testing.TB, after string) {
	t.Helper()
	select {
	case <-s.done:
		s.cmd = nil
	case <-time.After(30 * time.Second):
		t.Fatalf("redis-server on %s did not exit within 30 s of %s", s.Addr(), after)
	}
}
