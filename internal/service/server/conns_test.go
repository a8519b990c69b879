package server_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
)

// guard bounds every wait in these tests: against a hang, not a timing
// assertion.
const guard = 30 * time.Second

// capped serves h on a loopback listener through cl, wrapped by wrap when
// not nil. Each connection that turns idle is sent on the returned channel
// after cl has seen it.
func capped(t *testing.T, cl *server.ConnLimit, h http.Handler, wrap func(net.Listener) net.Listener) (string, <-chan net.Conn) {
	t.Helper()
	return cappedHook(t, cl, h, wrap, nil)
}

// cappedHook is capped whose server also calls hook, when not nil, on each
// change of a connection's state, after cl has seen it.
func cappedHook(t *testing.T, cl *server.ConnLimit, h http.Handler, wrap func(net.Listener) net.Listener, hook func(net.Conn, http.ConnState)) (string, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	idle := make(chan net.Conn, 64)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: guard,
		ConnState: func(c net.Conn, s http.ConnState) {
			if hook != nil {
				hook(c, s)
			}
			if s == http.StateIdle {
				idle <- c
			}
		},
	}
	cl.Install(srv)
	go srv.Serve(cl.Listener(ln))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), idle
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, guard)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(guard))
	return c
}

// get sends GET path on c and returns the status and body, or the error.
func get(c net.Conn, path string) (int, string, error) {
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: countlimit\r\n\r\n"); err != nil {
		return 0, "", err
	}
	return readResponse(c)
}

func readResponse(c net.Conn) (int, string, error) {
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// idleAfter makes a request on a new connection and waits until the
// server holds it idle.
func idleAfter(t *testing.T, addr string, idle <-chan net.Conn) net.Conn {
	t.Helper()
	c := dial(t, addr)
	if code, body, err := get(c, "/healthz"); code != 200 {
		t.Fatalf("GET /healthz: %d %s %v", code, body, err)
	}
	waitIdle(t, idle)
	return c
}

// waitIdle waits until the server holds a connection idle.
func waitIdle(t *testing.T, idle <-chan net.Conn) {
	t.Helper()
	select {
	case <-idle:
	case <-time.After(guard):
		t.Fatal("no connection turned idle")
	}
}

// closed reports whether the server closed c: a read gets EOF or a reset
// rather than waiting.
func closed(c net.Conn) bool {
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestConnLimitClosesLongestIdle: at the cap, a new connection is served,
// and the connection idle longest makes room for it.
func TestConnLimitClosesLongestIdle(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	cl := server.NewConnLimit(2, quiet)
	srv := server.New(server.Config{Limiter: countlimit.New(store), Rules: rulefile.Default(), Logger: quiet, Conns: cl})
	addr, idle := capped(t, cl, srv, nil)

	a := idleAfter(t, addr, idle)
	b := idleAfter(t, addr, idle)
	if st := cl.Stats(); st.Open != 2 || st.Idle != 2 {
		t.Fatalf("two idle connections: %+v", st)
	}
	c := idleAfter(t, addr, idle) // over the cap: served
	if !closed(a) {
		t.Error("the longest idle connection is still open")
	}
	if code, _, err := get(b, "/healthz"); code != 200 {
		t.Fatalf("the other idle connection: %d %v; want it kept and served", code, err)
	}
	waitIdle(t, idle)
	if code, _, err := get(c, "/healthz"); code != 200 {
		t.Fatalf("the new connection's second request: %d %v", code, err)
	}
	waitIdle(t, idle)
	if st := cl.Stats(); st.Open != 2 || st.Idle != 2 || st.Incomplete != 0 || st.IdleClosed != 1 || st.IncompleteClosed != 0 || st.Refused != 0 {
		t.Errorf("stats %+v, want 2 open, 2 idle, 1 idle closed", st)
	}
	_, body, _ := get(c, "/metrics")
	for _, want := range []string{
		"countlimit_http_connections_max 2\n",
		"countlimit_http_connections_open 2\n",
		"countlimit_http_connections_idle_closed_total 1\n",
		"countlimit_http_connections_incomplete_closed_total 0\n",
		"countlimit_http_connections_refused_total 0\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestConnLimitClosesIdleFirst: at the cap, newcomers take the slots of
// idle connections before that of a connection whose client has not sent
// its request yet, however long it has waited: an idle one loses nothing
// but the connection, where the other may be a client about to send. A
// flood of idle connections that reconnect as fast as they are closed
// otherwise turns the line over faster than a loaded client sends its
// request once connected.
func TestConnLimitClosesIdleFirst(t *testing.T) {
	t.Parallel()
	const max = 4
	cl := server.NewConnLimit(max, quiet)
	addr, idle := capped(t, cl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), nil)
	slow := dial(t, addr)
	for range max - 1 {
		idleAfter(t, addr, idle)
	}
	// Newcomers, each idle once answered, twice the cap of them.
	for i := range 2 * max {
		if code, _, err := get(dial(t, addr), "/healthz"); code != 200 {
			t.Fatalf("newcomer %d: %d %v", i, code, err)
		}
		waitIdle(t, idle)
	}
	if code, body, err := get(slow, "/healthz"); code != 200 || body != "ok" {
		t.Errorf("the client that connected first and sent its request after %d newcomers: %d %q %v; want it answered", 2*max, code, body, err)
	}
	if st := cl.Stats(); st.IdleClosed != 2*max || st.IncompleteClosed != 0 || st.Refused != 0 {
		t.Errorf("stats %+v, want %d idle closed, none incomplete, none refused", st, 2*max)
	}
}

// TestConnLimitRefusesWhenAllBusy: at the cap with every connection busy,
// a new connection is answered 503 and closed at once, not left waiting;
// once requests finish, new connections are served again.
func TestConnLimitRefusesWhenAllBusy(t *testing.T) {
	t.Parallel()
	cl := server.NewConnLimit(2, quiet)
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			entered <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})
	addr, idle := capped(t, cl, h, nil)

	busy := []net.Conn{dial(t, addr), dial(t, addr)}
	answers := make(chan error, len(busy))
	for _, c := range busy {
		go func() {
			code, _, err := get(c, "/block")
			if err == nil && code != 200 {
				err = errors.New(http.StatusText(code))
			}
			answers <- err
		}()
		<-entered
	}

	// This client has not sent its request yet, so the server's close
	// cannot reset the answer away.
	refused := dial(t, addr)
	code, body, err := readResponse(refused)
	if code != 503 || !strings.Contains(body, "too many open connections") {
		t.Errorf("a connection over the cap with every one busy: %d %q %v; want 503 at once", code, body, err)
	}
	if !closed(refused) {
		t.Error("the refused connection is still open")
	}

	close(release)
	for range busy {
		if err := <-answers; err != nil {
			t.Fatalf("a busy connection: %v", err)
		}
		waitIdle(t, idle)
	}
	if code, _, err := get(dial(t, addr), "/healthz"); code != 200 {
		t.Errorf("a new connection once requests finished: %d %v", code, err)
	}
	if st := cl.Stats(); st.Refused != 1 || st.IdleClosed != 1 || st.Open != 2 {
		t.Errorf("stats %+v, want 1 refused, 1 idle closed, 2 open", st)
	}
}

// emfile is a listener that, when armed, fails to accept its next
// connection once as a process out of files does, leaving it queued for
// the next Accept.
type emfile struct {
	net.Listener
	armed  atomic.Bool
	queued net.Conn // only the server's accept loop touches it
}

func (l *emfile) Accept() (net.Conn, error) {
	if c := l.queued; c != nil {
		l.queued = nil
		return c, nil
	}
	c, err := l.Listener.Accept()
	if err == nil && l.armed.CompareAndSwap(true, false) {
		l.queued = c
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return c, err
}

// TestConnLimitOutOfFiles: out of files below the cap (the files went
// elsewhere), the listener closes an idle connection and accepts the new
// one, instead of leaving it queued while the server backs off.
func TestConnLimitOutOfFiles(t *testing.T) {
	t.Parallel()
	cl := server.NewConnLimit(100, quiet)
	var inner *emfile
	addr, idle := capped(t, cl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), func(ln net.Listener) net.Listener {
		inner = &emfile{Listener: ln}
		return inner
	})
	a := idleAfter(t, addr, idle)
	inner.armed.Store(true)
	c := dial(t, addr)
	if code, _, err := get(c, "/"); code != 200 {
		t.Fatalf("a connection after running out of files: %d %v", code, err)
	}
	if !closed(a) {
		t.Error("the idle connection is still open")
	}
	if st := cl.Stats(); st.IdleClosed != 1 || st.Open != 1 {
		t.Errorf("stats %+v, want 1 idle closed, 1 open", st)
	}
}

func TestDefaultMaxConns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ files, store, want int }{
		{0, 0, 0}, // no limit known: no cap
		{0, 100, 0},
		{1024, 0, 896},
		{1024, 40, 856},
		{20000, 20, 17480},
		{256, 0, 192},
		{100, 0, 36},
		{256, 640, 64}, // a quarter at least
		{2, 0, 1},
	} {
		if got := server.DefaultMaxConns(tc.files, tc.store); got != tc.want {
			t.Errorf("DefaultMaxConns(%d, %d) = %d, want %d", tc.files, tc.store, got, tc.want)
		}
	}
}

// gated is a store whose calls each wait, after a word on entered, until
// open is closed.
type gated struct {
	driver.Store
	entered chan struct{}
	open    chan struct{}
}

func (g gated) Do(ctx context.Context, req *driver.Request) error {
	g.entered <- struct{}{}
	select {
	case <-g.open:
	case <-ctx.Done():
		return driver.Unavailable(ctx.Err())
	}
	return g.Store.Do(ctx, req)
}

// trickle writes head to c a byte at a time, then 'a' after 'a', pausing
// before each, until a write fails or stop is closed; it then reports on
// cut whether a write failed.
func trickle(c net.Conn, head string, stop <-chan struct{}, cut chan<- bool) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			cut <- false
			return
		case <-tick.C:
		}
		b := byte('a')
		if i < len(head) {
			b = head[i]
		}
		if _, err := c.Write([]byte{b}); err != nil {
			cut <- true
			return
		}
	}
}

// TestConnLimitYieldsToNewClients: at the cap, connections that hold a
// slot without a request in progress (silent, trickling a request line
// and headers, or trickling a body their handler waits for) give way to
// new clients, who are served at once; connections whose handler is at
// work keep their slot and get their answer.
func TestConnLimitYieldsToNewClients(t *testing.T) {
	t.Parallel()
	const max = 4
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	g := gated{Store: store, entered: make(chan struct{}, 1), open: make(chan struct{})}
	cl := server.NewConnLimit(max, quiet)
	api := server.New(server.Config{Limiter: countlimit.New(g), Rules: rulefile.Default(), Logger: quiet, Conns: cl, StoreTimeout: guard})
	slowEntered, slowRelease := make(chan struct{}, 1), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		slowEntered <- struct{}{}
		<-slowRelease
		_, _ = io.WriteString(w, "done")
	})
	addr, idle := capped(t, cl, mux, nil)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	// Released before the cleanups close the connections, should the test
	// stop early: handlers must not outlive it.
	defer func() {
		select {
		case <-slowRelease:
		default:
			close(slowRelease)
			close(g.open)
		}
	}()

	// Two connections at work: a handler that takes its time, and an allow
	// whose body the server has read whole, waiting on its store.
	slow := dial(t, addr)
	if _, err := io.WriteString(slow, "GET /slow HTTP/1.1\r\nHost: countlimit\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-slowEntered
	allow := dial(t, addr)
	body := `{"rule": "sms.code", "id": "busy"}`
	if _, err := io.WriteString(allow, "POST /v1/allow HTTP/1.1\r\nHost: countlimit\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	<-g.entered

	// More connections than the cap of each kind that holds a slot without
	// a request in progress: a body trickler (its handler reading the
	// body), a silent one, a header trickler, and again.
	const each = max + 2
	cuts := make(chan bool, 2*each)
	for i := range each {
		b := dial(t, addr)
		head := "POST /v1/allow HTTP/1.1\r\nHost: countlimit\r\nContent-Length: 60000\r\nExpect: 100-continue\r\n\r\n"
		if _, err := io.WriteString(b, head); err != nil {
			t.Fatal(err)
		}
		// 100 Continue: the handler is reading the body.
		if code, _, err := readResponse(b); code != http.StatusContinue {
			t.Errorf("body trickler %d: %d %v, want 100 Continue", i, code, err)
			cuts <- true
		} else {
			go trickle(b, `{"rule": "sms.code", "id": "`, stop, cuts)
		}
		_ = dial(t, addr) // silent
		go trickle(dial(t, addr), "GET /healthz HTTP/1.1\r\nHost: countlimit\r\nX-Pad: ", stop, cuts)
	}

	for i := range 3 {
		start := time.Now()
		code, body, err := get(dial(t, addr), "/healthz")
		if took := time.Since(start); code != 200 || took > guard/3 {
			t.Errorf("client %d over the cap: %d %q %v after %v; want 200 well before the header timeout (%v)", i, code, body, err, took, guard)
			continue
		}
		waitIdle(t, idle)
	}

	close(slowRelease)
	close(g.open)
	if code, body, err := readResponse(slow); code != 200 || body != "done" {
		t.Errorf("the slow handler's connection: %d %q %v; want its answer", code, body, err)
	}
	if code, body, err := readResponse(allow); code != 200 || !strings.Contains(body, `"allowed":true`) {
		t.Errorf("the allow waiting on its store: %d %q %v; want its answer", code, body, err)
	}
	// Idle first: the first client's connection, idle once answered, made
	// room for the second, and the second's for the third. The tricklers
	// and silent connections made the rest, oldest first: all but the
	// newest, a header trickler, which an idle connection spared.
	if st := cl.Stats(); st.Refused != 0 || st.Open != max || st.IncompleteClosed != 3*each-1 || st.IdleClosed != 2 {
		t.Errorf("stats %+v, want none refused, %d open, %d incomplete and 2 idle closed", st, max, 3*each-1)
	}
	if t.Failed() {
		return
	}
	for range 2*each - 1 {
		select {
		case cut := <-cuts:
			if !cut {
				t.Fatal("a trickler's connection is still open")
			}
		case <-time.After(guard):
			t.Fatal("a trickler's connection is still open")
		}
	}
}
