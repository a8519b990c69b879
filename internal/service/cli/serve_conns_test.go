//go:build linux

package cli_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/service/cli"
)

// fileLimitEnv switches TestServeIdleConnsAtFileLimit, re-run as a child
// process, to serving with the file limit it holds.
const fileLimitEnv = "COUNTLIMIT_TEST_SERVE_FILE_LIMIT"

// TestServeIdleConnsAtFileLimit: idle keep-alive connections must not use
// up the service's file limit. A child process (this test binary again)
// serves with a limit of fileLimit open files; the test holds more idle
// keep-alive connections to it than that, one request answered on each,
// and then fresh requests on new connections must still be answered.
// Without a cap on connections the service stops accepting at the limit
// ("too many open files") and no request is answered until idle ones time
// out.
func TestServeIdleConnsAtFileLimit(t *testing.T) {
	if v := os.Getenv(fileLimitEnv); v != "" {
		serveWithFileLimit(t, v)
		return
	}
	t.Parallel()
	const fileLimit, held, fresh = 1024, 1500, 4
	var own syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &own); err != nil || own.Cur < held+256 {
		t.Skipf("this process may open %d files (%v); the test holds %d connections", own.Cur, err, held)
	}

	child := startFileLimited(t, fileLimit)
	var conns []net.Conn
	var mu sync.Mutex // guards conns
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		// The cap made the room, not something else.
		if child.stop(t) && !t.Failed() && !strings.Contains(child.stderr.String(), "closing the connection longest without a request in progress") {
			t.Errorf("the serving child never closed an idle connection:\n%s", child.stderr.String())
		}
	}()
	base := child.addr

	// A few clients at a time, each connection answered once before the
	// next opens: held idle, as a client's pool keeps them. Stop at the
	// first one not answered: the service is stuck.
	var (
		next    atomic.Int32
		stuck   atomic.Bool
		stuckAt string
		wg      sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stuck.Load() {
				i := next.Add(1)
				if i > held {
					return
				}
				c, err := idleConn(base)
				if c != nil {
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
				if err != nil {
					if stuck.CompareAndSwap(false, true) {
						stuckAt = fmt.Sprintf("connection %d: %v", i, err)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	if stuck.Load() {
		t.Errorf("holding %d idle connections with a file limit of %d: %s", held, fileLimit, stuckAt)
	}

	client := &http.Client{
		Timeout:   10 * time.Second, // against a hang, not a timing assertion
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	errs := make([]error, fresh)
	for i := range fresh {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = freshAllow(client, base, fmt.Sprintf("fresh-%d", i))
		}()
	}
	wg.Wait()
	answered := 0
	for i, err := range errs {
		if err != nil {
			t.Errorf("fresh request %d with %d idle connections held: %v", i, held, err)
			continue
		}
		answered++
	}
	if answered != fresh {
		t.Errorf("%d of %d fresh requests answered", answered, fresh)
	}
}

// freshAllow sends POST /v1/allow for id of sms.code to the service at
// base, and returns why it was not allowed: the error, or the status and
// body as an *unanswered.
func freshAllow(client *http.Client, base, id string) error {
	body := `{"rule": "sms.code", "id": "` + id + `"}`
	resp, err := client.Post("http://"+base+"/v1/allow", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(raw), `"allowed":true`) {
		return &unanswered{resp.StatusCode, string(raw)}
	}
	return nil
}

// unanswered is a response that did not allow.
type unanswered struct {
	code int
	body string
}

func (u *unanswered) Error() string { return fmt.Sprintf("%d %s", u.code, u.body) }

// BenchmarkServeFlood: fresh requests to a service whose connections a
// flood holds at the cap, by the flood's shape. The service is a child
// that may open 1024 files (its cap: 896 connections). 1500 flood
// connections, each opened again as soon as it is closed, are idle
// keep-alive ones (one request answered, then nothing), silent ones
// (nothing sent) or ones trickling a header (a byte each 100 ms). Each op
// is one POST /v1/allow on a new connection, one at a time, that gets 2 s;
// the metrics are the shares answered (200), closed unanswered, refused
// (503) and timed out, and how fast the flood reconnects.
//
//	go test -run '^$' -bench BenchmarkServeFlood -benchtime 100x ./internal/service/cli
func BenchmarkServeFlood(b *testing.B) {
	const fileLimit, flood = 1024, 1500
	var own syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &own); err != nil || own.Cur < flood+256 {
		b.Skipf("this process may open %d files (%v); the flood holds %d connections", own.Cur, err, flood)
	}
	for _, shape := range []struct {
		name string
		hold func(c net.Conn, stop <-chan struct{}) // until c is closed, or stop
	}{
		{"idle", func(c net.Conn, _ <-chan struct{}) {
			if code, err := getOn(c, "/healthz"); code == 200 && err == nil {
				_, _ = c.Read(make([]byte, 1))
			}
		}},
		{"silent", func(c net.Conn, _ <-chan struct{}) { _, _ = c.Read(make([]byte, 1)) }},
		{"trickle", func(c net.Conn, stop <-chan struct{}) {
			head := "GET /healthz HTTP/1.1\r\nHost: countlimit\r\nX-Pad: "
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := c.Write([]byte{head[min(i, len(head)-1)]}); err != nil {
					return
				}
			}
		}},
	} {
		child := startFileLimited(b, fileLimit)
		stop := make(chan struct{})
		var opened atomic.Int64
		var wg sync.WaitGroup
		for range flood {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.DialTimeout("tcp", child.addr, 10*time.Second)
					if err != nil {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					opened.Add(1)
					shape.hold(c, stop)
					c.Close()
				}
			}()
		}
		// Until the flood has opened its connections twice over: the cap is
		// full and turning over.
		for deadline := time.Now().Add(time.Minute); opened.Load() < 2*flood && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		b.Run(shape.name, func(b *testing.B) {
			client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			var answered, closed, refused, late int
			from := opened.Load()
			for i := 0; b.Loop(); i++ {
				err := freshAllow(client, child.addr, fmt.Sprintf("fresh-%d-%d", b.N, i))
				var u *unanswered
				var ne net.Error
				switch {
				case err == nil:
					answered++
				case errors.As(err, &u) && u.code == http.StatusServiceUnavailable:
					refused++
				case errors.As(err, &ne) && ne.Timeout():
					late++
				case u == nil:
					closed++
					if closed <= 3 {
						b.Logf("fresh request %d closed: %v", i, err)
					}
				default:
					b.Fatalf("fresh request %d: %v", i, err)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(answered)/n, "answered/op")
			b.ReportMetric(float64(closed)/n, "closed/op")
			b.ReportMetric(float64(refused)/n, "refused/op")
			b.ReportMetric(float64(late)/n, "late/op")
			b.ReportMetric(float64(opened.Load()-from)/b.Elapsed().Seconds(), "flood-conns/s")
		})
		close(stop)
		child.stop(b) // closes the flood's connections
		wg.Wait()
	}
}

// getOn sends GET path on c and reads the answer's status.
func getOn(c net.Conn, path string) (int, error) {
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: countlimit\r\n\r\n"); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// fileLimited is a child process (this test binary again) serving
// "countlimit serve" on loopback with a file limit of its own.
type fileLimited struct {
	addr   string
	stderr *syncBuffer
	stdin  io.Closer
	kill   func() error
	exited chan error
}

// startFileLimited starts a fileLimited child that may open fileLimit
// files, and waits until it serves. Stop it with stop.
func startFileLimited(tb testing.TB, fileLimit int) *fileLimited {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeIdleConnsAtFileLimit$")
	cmd.Env = append(os.Environ(), fileLimitEnv+"="+strconv.Itoa(fileLimit))
	stdin, err := cmd.StdinPipe() // the child serves until it is closed
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	c := &fileLimited{stderr: &syncBuffer{}, stdin: stdin, exited: make(chan error, 1)}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c.kill = cmd.Process.Kill
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		c.exited <- cmd.Wait()
	}()
	select {
	case c.addr = <-addr:
		return c
	case err := <-c.exited:
		tb.Fatalf("the serving child exited before serving: %v\n%s", err, c.stderr.String())
	case <-time.After(60 * time.Second): // against a hang, not a timing assertion
		c.kill()
		tb.Fatalf("the serving child did not start\n%s", c.stderr.String())
	}
	return nil
}

// stop stops the child and reports whether it stopped well; tb fails if
// not.
func (c *fileLimited) stop(tb testing.TB) bool {
	tb.Helper()
	c.stdin.Close()
	select {
	case err := <-c.exited:
		if err != nil {
			tb.Errorf("the serving child: %v\n%s", err, c.stderr.String())
			return false
		}
		return true
	case <-time.After(60 * time.Second): // against a hang, not a timing assertion
		c.kill()
		tb.Errorf("the serving child did not stop\n%s", c.stderr.String())
		return false
	}
}

// idleConn opens a connection to addr and makes one request on it, leaving
// it open and idle. It returns the connection, when it opened, and why the
// request was not answered.
func idleConn(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // against a hang, not a timing assertion
	code, err := getOn(c, "/healthz")
	if err == nil && code != 200 {
		err = fmt.Errorf("GET /healthz: %d", code)
	}
	_ = c.SetDeadline(time.Time{})
	return c, err
}

// serveWithFileLimit is the child's side: it lowers its own file limit,
// soft and hard, to limit (the Go runtime raises a soft limit to the hard
// one at start) and runs "countlimit serve" until its stdin closes.
func serveWithFileLimit(t *testing.T, limit string) {
	n, err := strconv.ParseUint(limit, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if code := cli.Run(ctx, []string{"serve", "--addr", "127.0.0.1:0"}, os.Stdout, os.Stderr); code != cli.ExitOK {
		t.Errorf("serve: exit %d", code)
	}
}
