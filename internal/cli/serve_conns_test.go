//go:build linux

package cli_test

import (
	"bufio"
	"context"
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

	"github.com/countlimit/countlimit/internal/cli"
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

	cmd := exec.Command(os.Args[0], "-test.run=^TestServeIdleConnsAtFileLimit$")
	cmd.Env = append(os.Environ(), fileLimitEnv+"="+strconv.Itoa(fileLimit))
	stdin, err := cmd.StdinPipe() // the child serves until it is closed
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		exited <- cmd.Wait()
	}()
	var conns []net.Conn
	var mu sync.Mutex // guards conns
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		stdin.Close()
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("the serving child: %v\n%s", err, stderr.String())
			}
			// The cap made the room, not something else.
			if !t.Failed() && !strings.Contains(stderr.String(), "closing the connection longest without a request in progress") {
				t.Errorf("the serving child never closed an idle connection:\n%s", stderr.String())
			}
		case <-time.After(60 * time.Second): // against a hang, not a timing assertion
			cmd.Process.Kill()
			t.Errorf("the serving child did not stop\n%s", stderr.String())
		}
	}()
	var base string
	select {
	case base = <-addr:
	case err := <-exited:
		t.Fatalf("the serving child exited before serving: %v\n%s", err, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("the serving child did not start\n%s", stderr.String())
	}

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
			body := fmt.Sprintf(`{"rule": "sms.code", "id": "fresh-%d"}`, i)
			resp, err := client.Post("http://"+base+"/v1/allow", "application/json", strings.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || !strings.Contains(string(raw), `"allowed":true`) {
				errs[i] = fmt.Errorf("%d %s", resp.StatusCode, raw)
			}
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

// idleConn opens a connection to addr and makes one request on it, leaving
// it open and idle. It returns the connection, when it opened, and why the
// request was not answered.
func idleConn(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // against a hang, not a timing assertion
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: countlimit\r\n\r\n"); err != nil {
		return c, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("GET /healthz: %s", resp.Status)
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
