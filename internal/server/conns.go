package server

import (
	"container/list"
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
// At the cap, a new connection is let in by closing the connection that
// has been idle longest (waiting for its next request, in
// http.StateIdle): its client loses nothing but a connection it was not
// using and reconnects when it needs one. When no connection is idle (all
// are reading or answering a request), the new connection is refused at
// once: it is answered 503 with "Connection: close" and closed, without
// reading its request, so a client may see the connection reset instead.
// Refusing keeps the files below the limit for the store's connections
// and the requests in flight, and a client learns at once that it should
// retry rather than waiting in the listen queue. Connections that have not
// yet sent a request (http.StateNew) are not closed for others: they are
// bounded by the server's ReadHeaderTimeout.
//
// A request that arrives on an idle connection as it is closed fails as it
// would at the server's IdleTimeout; HTTP clients retry idempotent
// requests on a new connection.
//
// Install it on each server with both its Listener and its ConnState; the
// servers then share the cap. Hijacked connections count until closed.
// Its methods are safe for concurrent use.
type ConnLimit struct {
	max int
	log *slog.Logger

	mu   sync.Mutex
	open int       // admitted and not closed: each holds a file
	idle list.List // of *limitedConn, longest idle first
	// What was logged since open connections were last well below the cap.
	warnedIdle, warnedRefused, warnedFiles bool

	idleClosed atomic.Uint64
	refused    atomic.Uint64
}

// NewConnLimit returns a ConnLimit of n connections (at least 1). log
// (default slog.Default()) hears the first idle connection closed and the
// first connection refused, and hears them again once open connections
// have fallen to three quarters of the cap: one line per flood, not one
// per connection.
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
	Open, Idle int    // connections open now, and how many of them are idle
	IdleClosed uint64 // idle connections closed to make room for new ones
	Refused    uint64 // new connections refused because none was idle
}

// Stats returns l's state.
func (l *ConnLimit) Stats() ConnStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ConnStats{Open: l.open, Idle: l.idle.Len(), IdleClosed: l.idleClosed.Load(), Refused: l.refused.Load()}
}

// Listener returns ln with its connections counted against l: hand it to
// the http.Server whose ConnState is l.ConnState.
func (l *ConnLimit) Listener(ln net.Listener) net.Listener {
	return &limitedListener{Listener: ln, l: l}
}

// ConnState tracks which connections are idle; set it as the
// http.Server's ConnState (calling it from a hook of one's own is fine).
func (l *ConnLimit) ConnState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*limitedConn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case state == http.StateIdle && c.elem == nil && !c.gone:
		c.elem = l.idle.PushBack(c)
	case state != http.StateIdle && c.elem != nil:
		l.idle.Remove(c.elem)
		c.elem = nil
	}
}

type limitedListener struct {
	net.Listener
	l *ConnLimit
}

// Accept returns the next connection admitted. A listener out of files
// while below the cap (the files went to something else: the store's
// connections, a log) closes the longest idle connection and accepts
// again, rather than leave the server to back off and retry while the
// connection waits in the listen queue.
func (ln *limitedListener) Accept() (net.Conn, error) {
	for {
		nc, err := ln.Listener.Accept()
		if err != nil {
			if outOfFiles(err) && ln.l.closeIdle() {
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

// admit counts nc in, closing the longest idle connection when at the cap
// to make room; with none idle it refuses nc and returns nil.
func (l *ConnLimit) admit(nc net.Conn) *limitedConn {
	l.mu.Lock()
	var victim *limitedConn
	if l.open >= l.max {
		victim = l.takeIdle()
		if victim == nil {
			warn := !l.warnedRefused
			l.warnedRefused = true
			l.mu.Unlock()
			l.refused.Add(1)
			if warn {
				l.log.Warn("open connections at the cap and none idle: refusing new connections with 503 until one closes", "max_conns", l.max)
			}
			refuse(nc)
			return nil
		}
		victim.gone = true // its slot is the newcomer's
	} else {
		l.open++
	}
	c := &limitedConn{Conn: nc, l: l}
	warn := victim != nil && !l.warnedIdle
	l.warnedIdle = l.warnedIdle || victim != nil
	l.mu.Unlock()
	if victim != nil {
		l.idleClosed.Add(1)
		if warn {
			l.log.Warn("open connections at the cap: closing the longest idle keep-alive connection for each new one", "max_conns", l.max)
		}
		_ = victim.Close()
	}
	return c
}

// takeIdle takes the longest idle connection off the idle list and
// returns it, or nil when none is idle. l.mu must be held.
func (l *ConnLimit) takeIdle() *limitedConn {
	e := l.idle.Front()
	if e == nil {
		return nil
	}
	c := l.idle.Remove(e).(*limitedConn)
	c.elem = nil
	return c
}

// closeIdle closes the longest idle connection to free its file, and
// reports whether there was one.
func (l *ConnLimit) closeIdle() bool {
	l.mu.Lock()
	victim := l.takeIdle()
	if victim == nil {
		l.mu.Unlock()
		return false
	}
	warn := !l.warnedFiles
	l.warnedFiles = true
	l.mu.Unlock()
	l.idleClosed.Add(1)
	if warn {
		l.log.Warn("out of files below the connection cap: closing idle connections to accept new ones; lower the cap or raise the file limit", "max_conns", l.max)
	}
	_ = victim.Close()
	return true
}

// release takes a closed connection out of the count.
func (l *ConnLimit) release(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.elem != nil {
		l.idle.Remove(c.elem)
		c.elem = nil
	}
	if c.gone {
		return
	}
	c.gone = true
	l.open--
	if l.open <= l.max-l.max/4 {
		l.warnedIdle, l.warnedRefused, l.warnedFiles = false, false, false
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
	elem   *list.Element // in l.idle while idle; guarded by l.mu
	gone   bool          // no longer counted in l.open; guarded by l.mu
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
