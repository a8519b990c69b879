//go:build unix && !aix

package server_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/service/server"
)

// lateListener hands the server connections whose reads wait until the
// test frees them, as on a server too busy to get to them yet.
type lateListener struct {
	net.Listener
	accepted chan *lateConn
}

func (l *lateListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &lateConn{TCPConn: nc.(*net.TCPConn), free: make(chan struct{}), changed: make(chan struct{})}
	l.accepted <- c
	return c, nil
}

// lateConn is the server's end of a connection whose reads wait for free
// to close. It keeps *net.TCPConn's methods, SyscallConn among them: the
// ConnLimit sees the socket.
type lateConn struct {
	*net.TCPConn
	free chan struct{}

	mu      sync.Mutex
	reading bool          // a read waits on the socket
	read    int           // bytes read so far
	changed chan struct{} // closed and replaced when reading or read change
}

func (c *lateConn) Read(p []byte) (int, error) {
	<-c.free
	c.set(func() { c.reading = true })
	n, err := c.TCPConn.Read(p)
	c.set(func() { c.reading, c.read = false, c.read+n })
	return n, err
}

func (c *lateConn) set(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f()
	close(c.changed)
	c.changed = make(chan struct{})
}

// waitReading waits until the server has read n bytes from c, all that its
// client sent, and waits for more: it waits on its client.
func (c *lateConn) waitReading(t *testing.T, n int) {
	t.Helper()
	for {
		c.mu.Lock()
		done, changed := c.reading && c.read == n, c.changed
		c.mu.Unlock()
		if done {
			return
		}
		select {
		case <-changed:
		case <-time.After(guard):
			t.Fatalf("the server never waited on its client after reading %d bytes", n)
		}
	}
}

// waitUnread waits until n bytes from the client wait, unread, in c's
// socket.
func (c *lateConn) waitUnread(t *testing.T, n int) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(guard))
	buf := make([]byte, n)
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		var got int
		got, _, perr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if errors.Is(perr, syscall.EAGAIN) {
			perr = nil
		}
		return perr != nil || got >= n
	})
	if err != nil || perr != nil {
		t.Fatalf("waiting for %d bytes in the server's socket: %v %v", n, err, perr)
	}
}

// TestConnLimitPassesOverRequestsTheServerHasNotServed: at the cap, a
// connection whose client has sent its whole request does not give way to
// newcomers while the server is late with it, whether the request still
// waits in the socket or the server has read it and not yet started its
// handler; newcomers take the slots of connections whose server waits on
// their clients (idle, silent, part of a request line sent), however many
// come, and both late requests are answered once the server gets to them.
// Under a flood that reconnects as fast as it is closed, the line of
// connections turns over faster than a loaded server starts handlers: a
// fresh client's request was closed before the server read it.
func TestConnLimitPassesOverRequestsTheServerHasNotServed(t *testing.T) {
	t.Parallel()
	const max = 4
	cl := server.NewConnLimit(max, quiet)
	ll := &lateListener{accepted: make(chan *lateConn, 64)}
	var lateAddr atomic.Value // the client address of the request read and held
	heldActive, releaseActive := make(chan struct{}), make(chan struct{})
	addr, idle := cappedHook(t, cl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), func(ln net.Listener) net.Listener {
		ll.Listener = ln
		return ll
	}, func(nc net.Conn, s http.ConnState) {
		if a, _ := lateAddr.Load().(string); s == http.StateActive && a == nc.RemoteAddr().String() {
			// The request is read; its handler has not started.
			close(heldActive)
			<-releaseActive
		}
	})
	const request = "GET /healthz HTTP/1.1\r\nHost: countlimit\r\n\r\n"
	var once sync.Once
	release := func() { once.Do(func() { close(releaseActive) }) }
	defer release()

	// Unread: its request waits in the socket.
	unread := dial(t, addr)
	if _, err := io.WriteString(unread, request); err != nil {
		t.Fatal(err)
	}
	unreadConn := <-ll.accepted
	unreadConn.waitUnread(t, len(request))

	// Read and held before its handler.
	held := dial(t, addr)
	lateAddr.Store(held.LocalAddr().String())
	close((<-ll.accepted).free)
	if _, err := io.WriteString(held, request); err != nil {
		t.Fatal(err)
	}
	select {
	case <-heldActive:
	case <-time.After(guard):
		t.Fatal("the held request was never read")
	}

	// Newcomers, three times the cap, each settled (its server waiting on
	// its client) before the next comes.
	const partial = "GET /healthz HTTP/1.1\r\nHost: coun"
	const newcomers = 3 * max
	for i := range newcomers {
		c := dial(t, addr)
		sc := <-ll.accepted
		close(sc.free)
		switch i % 3 {
		case 0: // idle after a request
			if code, _, err := get(c, "/healthz"); code != 200 {
				t.Fatalf("newcomer %d: %d %v", i, code, err)
			}
			waitIdle(t, idle)
			sc.waitReading(t, len(request))
		case 1: // silent
			sc.waitReading(t, 0)
		case 2: // part of its request line
			if _, err := io.WriteString(c, partial); err != nil {
				t.Fatal(err)
			}
			sc.waitReading(t, len(partial))
		}
	}
	closedFor := newcomers - (max - 2)
	if st := cl.Stats(); st.Refused != 0 || st.Open != max || st.IdleClosed+st.IncompleteClosed != uint64(closedFor) {
		t.Errorf("stats %+v after %d newcomers, want none refused, %d open, %d closed for newcomers", st, newcomers, max, closedFor)
	}

	close(unreadConn.free)
	release()
	for name, c := range map[string]net.Conn{"the request unread in its socket": unread, "the request read, its handler not started": held} {
		if code, body, err := readResponse(c); code != 200 || body != "ok" {
			t.Errorf("%s, after %d newcomers at the cap: %d %q %v; want it answered", name, newcomers, code, body, err)
		}
	}
}
