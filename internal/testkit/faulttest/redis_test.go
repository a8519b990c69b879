//go:build fault

package faulttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestRedis(t *testing.T) {
	// go-redis logs every failed dial; the figures say what matters.
	redis.SetLogger(quietLogger{})
	srv := startRedis(t)
	base := runtime.NumGoroutine()
	px := startProxy(t, srv.addr())

	// Clients as an application makes them: go-redis's defaults (pool,
	// retries), with context deadlines honoured as redisstore's doc asks.
	direct := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true})
	proxied := redis.NewClient(&redis.Options{Addr: px.addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { direct.Close(); proxied.Close() })
	on := func(c *redis.Client) *target {
		return &target{
			store:   "redis",
			limiter: countlimit.New(redisstore.New(c)),
			counts:  srv.counts,
			// Any failure may have run: the reply may be what was lost.
			maybeCounted: func(error) bool { return true },
			// Once every connection of its pool has failed to dial,
			// go-redis redials once a second (a fixed probe in its
			// pool): after an outage the first success may come up to
			// 1 s plus a dial after the server is back.
			maxRecovery: 1500 * time.Millisecond,
		}
	}
	faults := []struct {
		via *redis.Client
		fault
	}{
		{direct, baseline},
		{direct, fault{name: "scriptflush", keepsData: true, noErrors: true, inject: func(t *testing.T, p *phase) {
			for range 5 {
				srv.do(t, "SCRIPT", "FLUSH")
				p.back()
				time.Sleep(200 * time.Millisecond)
			}
		}}},
		{direct, fault{name: "kill", keepsData: true, inject: func(t *testing.T, p *phase) {
			for range 5 {
				srv.do(t, "CLIENT", "KILL", "TYPE", "normal")
				p.back()
				time.Sleep(200 * time.Millisecond)
			}
		}}},
		{direct, fault{name: "pause", keepsData: true, inject: func(t *testing.T, p *phase) {
			srv.do(t, "CLIENT", "PAUSE", "2000", "ALL")
			srv.do(t, "PING") // answered when the pause ends
			p.back()
		}}},
		{proxied, fault{name: "lostreply", keepsData: true, inject: func(t *testing.T, p *phase) {
			for range 10 {
				px.dropReply(t)
				p.back()
				time.Sleep(100 * time.Millisecond)
			}
		}}},
		{direct, fault{name: "restart", inject: func(t *testing.T, p *phase) {
			srv.shutdown(t)
			srv.start(t)
			p.back()
		}}},
		{direct, fault{name: "outage10s", inject: func(t *testing.T, p *phase) {
			srv.shutdown(t)
			time.Sleep(10 * time.Second)
			srv.start(t)
			p.back()
		}}},
	}
	for _, f := range faults {
		run(t, on(f.via), f.fault)
	}
	direct.Close()
	proxied.Close()
	px.Close()
	checkGoroutines(t, base)
}

// redisServer is a redis-server of the test's own on a free loopback port,
// without persistence: a restart loses every key.
type redisServer struct {
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
	log  *os.File
}

// startRedis starts redis-server, killed when t ends. It skips t (fails it
// when backends are required) when redis-server is missing.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testbackend.Unavailable(t, "redis-server", err)
	}
	s := &redisServer{bin: bin, dir: t.TempDir(), port: testenv.FreePort(t)}
	s.log, err = os.Create(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.kill()
		s.log.Close()
		if t.Failed() {
			if b, err := os.ReadFile(s.log.Name()); err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("redis-server log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-20):], "\n"))
			}
		}
	})
	s.start(t)
	return s
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// start starts the server and waits until it answers PING.
func (s *redisServer) start(t *testing.T) {
	t.Helper()
	s.cmd = exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING within 10 s", s.addr())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// shutdown stops the server without saving and waits for it to exit.
func (s *redisServer) shutdown(t *testing.T) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	_ = c.ShutdownNoSave(context.Background()).Err() // the connection closes: no reply
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
		s.cmd = nil
	case <-time.After(10 * time.Second):
		t.Fatal("redis-server did not exit within 10 s of SHUTDOWN NOSAVE")
	}
}

func (s *redisServer) kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// do runs one command on a connection of its own.
func (s *redisServer) do(t *testing.T, args ...any) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// counts reads the count field of every given id's counter that exists.
func (s *redisServer) counts(ctx context.Context, ut countlimit.UseType, ids []string) (map[string]int64, error) {
	c := redis.NewClient(&redis.Options{Addr: s.addr()})
	defer c.Close()
	cmds := make([]*redis.StringCmd, len(ids))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGet(ctx, "countlimit:"+string(ut)+":{"+id+"}", "c") // docs/library.md's key layout; the suite's ids need no escaping
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	out := map[string]int64{}
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, fmt.Errorf("%s: %w", ids[i], err)
		default:
			out[ids[i]] = n
		}
	}
	return out, nil
}

// proxy relays TCP between clients and Redis. On request it loses one reply:
// it forwards the next EVAL or EVALSHA, then closes that connection instead
// of relaying the server's answer, as a network failure would.
type proxy struct {
	ln       net.Listener
	upstream string
	drops    atomic.Int32 // replies still to lose
	dropped  atomic.Int32

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	t.Cleanup(p.Close)
	p.wg.Go(p.serve)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// dropReply loses the reply to the next script call and waits until it has.
func (p *proxy) dropReply(t *testing.T) {
	t.Helper()
	want := p.dropped.Load() + 1
	p.drops.Add(1)
	deadline := time.Now().Add(5 * time.Second)
	for p.dropped.Load() < want {
		if time.Now().After(deadline) {
			t.Fatal("the proxy saw no script call to lose the reply of within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Close stops accepting, closes every connection and waits for its
// goroutines. It is idempotent.
func (p *proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.relay(c) })
	}
}

// track registers conns for Close, or reports that the proxy is closed.
func (p *proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *proxy) relay(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.upstream, time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	defer p.untrack(client, server)
	var loseNext atomic.Bool
	replies := make(chan struct{})
	go func() {
		defer close(replies)
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && loseNext.Load() {
				p.dropped.Add(1)
				break
			}
			if n > 0 {
				if _, err := client.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		client.Close()
		server.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if isScript(buf[:n]) && p.takeDrop() {
				loseNext.Store(true)
			}
			if _, err := server.Write(buf[:n]); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	client.Close()
	server.Close()
	<-replies
}

func (p *proxy) takeDrop() bool {
	for {
		n := p.drops.Load()
		if n <= 0 {
			return false
		}
		if p.drops.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// isScript reports whether a RESP request is EVAL or EVALSHA.
func isScript(req []byte) bool {
	req = bytes.ToLower(req)
	return bytes.Contains(req, []byte("\r\nevalsha\r\n")) || bytes.Contains(req, []byte("\r\neval\r\n"))
}
