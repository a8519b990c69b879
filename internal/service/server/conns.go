package server

import (
	"container/list"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ConnLimit caps the connections that the http.Servers it is installed on
// hold open together, so that clients cannot use up the process's file
// limit (RLIMIT_NOFILE) with connections: a process out of files accepts
// nothing, so every new request waits until some connection closes, which
// for idle keep-alive connections is the server's IdleTimeout.
//
// The cap yields to new clients. At the cap, a new connection is let in by
// closing an open connection without a request in progress, that is
// without a handler at work on a whole request: the one idle longest
// between requests (http.StateIdle), else the one longest with its request
// incomplete: new and silent, sending its request line or headers (however
// slowly), or sending a body its handler waits for (see below). Each such
// connection queues from the instant it began to wait: when it was
// accepted, turned idle, or its handler began to read its body. Whatever
// the server has not begun to act on is lost with it, and nothing else: an
// idle client reconnects when it needs to, and a request closed before it
// was whole was never answered or counted, so it may be sent again. Idle
// connections go first because they lose nothing but the connection, where
// an incomplete one may be a client about to send the rest, or all, of a
// request: under a flood of idle connections that reconnect as fast as
// they are closed, the line turns over in a fraction of a second, less
// than a loaded client may take from connecting to sending.
//
// A connection gives way only while its server waits on its client. One
// whose client has sent bytes that the server has not read yet (they wait
// in the socket), or has read and not yet acted on, waits on the server,
// which is late: it is passed over, and goes to the back of its line as if
// it began to wait then. The line can turn over faster than a loaded
// server gets from accepting a connection to starting its handler; a new
// client's whole request would otherwise be closed with its connection
// before the server read it, to make room for a newcomer that may be a
// flood's own. When every connection an admission looks at (at most
// maxPassOver) waits on the server, the first of them gives way all the
// same: a newcomer is refused only when every connection is at work.
//
// A handler at work keeps its connection: from the moment the server has
// read a request's headers and called its handler, until the response is
// written, the connection is never closed for another. When every open
// connection is at work, the new connection is refused at once: it is
// answered 503 with "Connection: close" and closed, without reading its
// request, so a client may see the connection reset instead. Refusing
// keeps the files below the limit for the store's connections and the
// requests in flight, and a client learns at once that it should retry
// rather than waiting in the listen queue.
//
// A body is part of the request: a handler that is waiting for the rest of
// its body has acted on nothing yet. A handler that reads its body with
// awaitBody (the service's handlers do, through readBody) gives its
// connection back to the queue while it reads, and acts on the request
// only if the connection was not given to a new client meanwhile.
// Otherwise a client that sends headers and then trickles a body within
// the server's ReadTimeout would hold its slot against every newcomer as a
// silent one did, and a cap's worth of such clients would lock everyone
// else out; a shorter ReadTimeout would only shorten each hold, not stop
// them being renewed. A handler that does not read its body that way is
// at work from its start.
//
// A request that arrives on a connection as it is closed fails as it would
// at the server's IdleTimeout; HTTP clients retry idempotent requests on a
// new connection.
//
// Serve each server on l.Listener and Install l on it; the servers then
// share the cap. A connection that no installed server serves is never
// closed for another: a listener without Install only refuses at the cap.
// Hijacked connections count until closed, at work. Its methods are safe
// for concurrent use.
type ConnLimit struct {
	max int
	log *slog.Logger

	mu   sync.Mutex
	open int // admitted and not closed: each holds a file
	// The connections without a request in progress, what may be closed
	// for a new connection: those idle between requests and those whose
	// request is incomplete, each line the longest waiting first.
	idle, incomplete list.List // of *limitedConn
	// What was logged since open connections were last well below the cap.
	warnedYield, warnedRefused, warnedFiles bool

	idleClosed       atomic.Uint64
	incompleteClosed atomic.Uint64
	refused          atomic.Uint64
}

// NewConnLimit returns a ConnLimit of n connections (at least 1). log
// (default slog.Default()) hears the first connection closed for a new one
// and the first connection refused, and hears them again once open
// connections have fallen to three quarters of the cap: one line per
// flood, not one per connection.
func NewConnLimit(n int, log *slog.Logger) *ConnLimit {
	if log == nil {
		log = slog.Default()
	}
	return &ConnLimit{max: max(n, 1), log: log}
}

// Max returns the cap.
func (l *ConnLimit) Max() int { return l.max }

// ConnStats is a ConnLimit's state.
type ConnStats struct {
	// Connections open now; how many of them are idle between requests;
	// how many hold an incomplete request (new, silent, or sending its
	// request line, headers or a body that its handler waits for). The
	// rest are at work on a request.
	Open, Idle, Incomplete int
	// Connections closed to make room for new ones: idle ones, and ones
	// whose request was incomplete.
	IdleClosed, IncompleteClosed uint64
	// New connections refused because every open one was at work.
	Refused uint64
}

// Stats returns l's state.
func (l *ConnLimit) Stats() ConnStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ConnStats{
		Open: l.open, Idle: l.idle.Len(), Incomplete: l.incomplete.Len(),
		IdleClosed: l.idleClosed.Load(), IncompleteClosed: l.incompleteClosed.Load(), Refused: l.refused.Load(),
	}
}

// Listener returns ln with its connections counted against l: hand it to
// an http.Server that l is installed on.
func (l *ConnLimit) Listener(ln net.Listener) net.Listener {
	return &limitedListener{Listener: ln, l: l}
}

// Install makes srv tell l which of its connections have a request in
// progress: it sets srv's ConnContext, ConnState and Handler, each calling
// the one srv had (a nil Handler is http.DefaultServeMux). Call it before
// srv serves, and serve srv on l.Listener.
func (l *ConnLimit) Install(srv *http.Server) {
	connContext, connState, h := srv.ConnContext, srv.ConnState, srv.Handler
	if h == nil {
		h = http.DefaultServeMux
	}
	srv.ConnContext = func(ctx context.Context, nc net.Conn) context.Context {
		if connContext != nil {
			ctx = connContext(ctx, nc)
		}
		c, ok := nc.(*limitedConn)
		if !ok || c.l != l {
			return ctx
		}
		// The server is about to serve c, and it has sent nothing yet.
		l.mu.Lock()
		l.wait(c, false)
		l.mu.Unlock()
		return context.WithValue(ctx, connKey{}, c)
	}
	srv.ConnState = func(nc net.Conn, state http.ConnState) {
		l.connState(nc, state)
		if connState != nil {
			connState(nc, state)
		}
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := requestConn(r); c != nil && c.l == l && !l.work(c) {
			// Given to a new connection as its headers became whole: the
			// client sees its connection closed, and nothing is done.
			return
		}
		h.ServeHTTP(w, r)
	})
}

// connKey is the context key of a request's *limitedConn.
type connKey struct{}

// requestConn returns the counted connection r came on, or nil. Only
// HTTP/1 requests have one: HTTP/2 streams share a connection.
func requestConn(r *http.Request) *limitedConn {
	if r.ProtoMajor != 1 {
		return nil
	}
	c, _ := r.Context().Value(connKey{}).(*limitedConn)
	return c
}

// connState follows the server's states of l's connections.
func (l *ConnLimit) connState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*limitedConn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateIdle:
		l.wait(c, true)
	case http.StateActive:
		// The next request's headers came. Not at work until its handler
		// starts, a moment later: no longer idle.
		if c.elem != nil && c.idle {
			l.wait(c, false)
		}
	case http.StateHijacked:
		l.unwait(c)
	}
}

// wait queues c, last in its line, as holding its slot without a request
// in progress: idle between requests, or else with an incomplete request.
// l.mu must be held.
func (l *ConnLimit) wait(c *limitedConn, idle bool) {
	if c.gone {
		return
	}
	l.unwait(c)
	c.idle = idle
	c.elem = l.line(c).PushBack(c)
}

// unwait takes c out of its line, if it is in one. l.mu must be held.
func (l *ConnLimit) unwait(c *limitedConn) {
	if c.elem == nil {
		return
	}
	l.line(c).Remove(c.elem)
	c.elem = nil
}

// line returns the line c waits in, or would. l.mu must be held.
func (l *ConnLimit) line(c *limitedConn) *list.List {
	if c.idle {
		return &l.idle
	}
	return &l.incomplete
}

// work marks c at work on a request, never to be closed for another until
// it waits again, and reports whether c is still open and counted. False
// means that c was closed, or given to a new connection that will close it
// at once: work closes it first, so that nothing the server writes on it
// can reach the client, and its request must not be acted on.
func (l *ConnLimit) work(c *limitedConn) bool {
	l.mu.Lock()
	l.unwait(c)
	gone := c.gone
	l.mu.Unlock()
	if gone {
		_ = c.Close()
	}
	return !gone
}

// awaitBody gives r's connection back to the queue of connections without
// a request in progress while r's handler reads its body; received marks
// it at work again once the body is read (or reading failed) and reports
// whether it may still be answered. When received reports false the
// connection went to a new client, and the handler must act on nothing;
// its answer would go nowhere. A request with no body, or on a connection
// no ConnLimit counts, is at work throughout.
func awaitBody(r *http.Request) (received func() bool) {
	c := requestConn(r)
	if c == nil || r.Body == nil || r.Body == http.NoBody {
		return func() bool { return true }
	}
	c.l.mu.Lock()
	c.l.wait(c, false)
	c.l.mu.Unlock()
	return func() bool { return c.l.work(c) }
}

type limitedListener struct {
	net.Listener
	l *ConnLimit
}

// Accept returns the next connection admitted. A listener out of files
// while below the cap (the files went to something else: the store's
// connections, a log) closes a connection without a request in progress
// (see pick) and accepts again, rather than leave the server to back off
// and retry while the connection waits in the listen queue.
func (ln *limitedListener) Accept() (net.Conn, error) {
	for {
		nc, err := ln.Listener.Accept()
		if err != nil {
			if outOfFiles(err) && ln.l.closeWaiting() {
				continue
			}
			return nil, err
		}
		if c := ln.l.admit(nc); c != nil {
			return c, nil
		}
	}
}

func outOfFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// admit counts nc in, closing a connection without a request in progress
// (see pick) when at the cap to make room; with every connection at work
// it refuses nc and returns nil.
func (l *ConnLimit) admit(nc net.Conn) *limitedConn {
	l.mu.Lock()
	var victim *limitedConn
	if l.open >= l.max {
		victim = l.takeWaiting()
		if victim == nil {
			warn := !l.warnedRefused
			l.warnedRefused = true
			l.mu.Unlock()
			l.refused.Add(1)
			if warn {
				l.log.Warn("open connections at the cap and every one at work on a request: refusing new connections with 503 until one closes or waits", "max_conns", l.max)
			}
			refuse(nc)
			return nil
		}
	} else {
		l.open++
	}
	c := &limitedConn{Conn: nc, l: l}
	warn := victim != nil && !l.warnedYield
	l.warnedYield = l.warnedYield || victim != nil
	l.mu.Unlock()
	if victim != nil {
		if warn {
			l.log.Warn("open connections at the cap: closing the connection longest without a request in progress (idle ones first, then ones whose request is incomplete) for each new one", "max_conns", l.max)
		}
		_ = victim.Close()
	}
	return c
}

// maxPassOver bounds the connections one admission looks at for one whose
// server waits on its client: each look is a system call under l.mu.
const maxPassOver = 64

// takeWaiting takes the connection pick picks out of its line and out of
// the count (its slot is the caller's), and returns it for the caller to
// close; nil when every connection is at work. l.mu must be held.
func (l *ConnLimit) takeWaiting() *limitedConn {
	c := l.pick()
	if c == nil {
		return nil
	}
	if c.idle {
		l.idleClosed.Add(1)
	} else {
		l.incompleteClosed.Add(1)
	}
	l.unwait(c)
	c.gone = true
	return c
}

// pick returns the connection idle longest, else the one longest with its
// request incomplete, whose server waits on its client; it passes over
// (to the back of their lines) those whose clients have sent what the
// server has yet to read or act on, and when the first maxPassOver all
// have, it returns the first of them. Nil when no connection waits. l.mu
// must be held.
func (l *ConnLimit) pick() *limitedConn {
	var first *limitedConn
	looked := 0
	for _, line := range [...]*list.List{&l.idle, &l.incomplete} {
		for n := line.Len(); n > 0 && looked < maxPassOver; n-- {
			e := line.Front()
			c := e.Value.(*limitedConn)
			if !c.owed.Load() && !unread(c.Conn) {
				return c
			}
			if first == nil {
				first = c
			}
			looked++
			line.MoveToBack(e)
		}
	}
	return first
}

// closeWaiting closes a connection without a request in progress (see
// pick) to free its file, and reports whether there was one.
func (l *ConnLimit) closeWaiting() bool {
	l.mu.Lock()
	victim := l.takeWaiting()
	if victim == nil {
		l.mu.Unlock()
		return false
	}
	l.open-- // its file is freed, not passed on
	warn := !l.warnedFiles
	l.warnedFiles = true
	l.mu.Unlock()
	if warn {
		l.log.Warn("out of files below the connection cap: closing connections without a request in progress to accept new ones; lower the cap or raise the file limit", "max_conns", l.max)
	}
	_ = victim.Close()
	return true
}

// release takes a closed connection out of the count.
func (l *ConnLimit) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unwait(c)
	if c.gone {
		return
	}
	c.gone = true
	l.open--
	if l.open <= l.max-l.max/4 {
		l.warnedYield, l.warnedRefused, l.warnedFiles = false, false, false
	}
}

// refusal is the answer to a connection refused at the cap.
var refusal = func() string {
	body := `{"error":"too many open connections, and every one is busy: retry in a moment"}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\n" +
		"Connection: close\r\n" +
		"Content-Type: application/json\r\n" +
		"Retry-After: 1\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n" +
		"\r\n" + body
}()

func refuse(nc net.Conn) {
	// A fresh connection's send buffer takes the answer at once; the
	// deadline only keeps a broken one from holding the accept loop.
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(nc, refusal)
	_ = nc.Close()
}

// limitedConn is a connection counted against its ConnLimit until closed.
type limitedConn struct {
	net.Conn
	l      *ConnLimit
	closed atomic.Bool
	// Guarded by l.mu: its place in a line while it has no request in
	// progress, whether that is l.idle, and whether it no longer counts
	// in l.open (closed, or its slot given to a new connection).
	elem *list.Element
	idle bool
	gone bool
	// owed is set while the server holds bytes from the client that it
	// has not acted on: from a Read that returned some until the server
	// reads again, having taken in what it had and waiting for more.
	owed atomic.Bool
}

// Read tells the server's reads apart for pick: see owed.
func (c *limitedConn) Read(p []byte) (int, error) {
	c.owed.Store(false)
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.owed.Store(true)
	}
	return n, err
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c)
	}
	return err
}

// CloseWrite lets http.Server half-close the connection before closing it,
// as it does for a bare TCP connection, so that the client reads the last
// response before the close.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// DefaultMaxConns is the cap on connections for a process that may open
// fileLimit files (RLIMIT_NOFILE) and whose store holds up to storeConns
// connections: the file limit less the store's connections and a reserve
// of an eighth of the limit, at least 64, for what else holds files (the
// listeners, log files, the runtime, the DNS resolver, /metrics reading
// /proc). It is never below a quarter of the limit, so that a small limit
// with a large store pool still serves. 0 (no cap) when the limit is not
// known or there is none.
func DefaultMaxConns(fileLimit, storeConns int) int {
	if fileLimit <= 0 {
		return 0
	}
	return max(fileLimit-storeConns-max(fileLimit/8, 64), fileLimit/4, 1)
}
