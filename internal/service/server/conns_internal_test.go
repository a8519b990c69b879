package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// pipeConn is the server's end of a connection to nowhere, closed with the
// test.
func pipeConn(t *testing.T) net.Conn {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { server.Close(); client.Close() })
	return server
}

// yield plays the first half of admit at the cap: it takes the connection
// longest without a request in progress for a newcomer, which has not
// closed it yet, and returns it.
func yield(l *ConnLimit) *limitedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takeWaiting()
}

// TestYieldedRequestIsNotActedOn: a connection given to a new one just as
// its request became whole (its headers read, or its body) does not act on
// the request: the handler is not called, or readBody answers nothing, and
// the connection is closed before anything can be written on it. The
// end-to-end tests cannot time that race; here it is played in order.
func TestYieldedRequestIsNotActedOn(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l := NewConnLimit(1, quiet)
	called := false
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true })}
	l.Install(srv)

	// Headers read as a new connection takes the slot.
	c := l.admit(pipeConn(t))
	ctx := srv.ConnContext(context.Background(), c)
	if v := yield(l); v != c {
		t.Fatalf("a new connection took %v, want the only one, which has sent nothing", v)
	}
	srv.Handler.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, "GET", "/healthz", nil))
	if called || !c.closed.Load() {
		t.Errorf("a request on a connection given to a new one: handler called %v, connection closed %v; want it closed, the handler not called", called, c.closed.Load())
	}

	// The body read whole as a new connection takes the slot.
	l = NewConnLimit(1, quiet)
	l.Install(srv)
	c = l.admit(pipeConn(t))
	ctx = srv.ConnContext(context.Background(), c)
	if !l.work(c) {
		t.Fatal("a connection whose handler starts is not at work")
	}
	if st := l.Stats(); st.Incomplete != 0 || yield(l) != nil {
		t.Fatalf("stats %+v with the handler at work; want none incomplete, and none to give a newcomer", st)
	}
	newcomer := func() {
		if st := l.Stats(); st.Incomplete != 1 {
			t.Errorf("stats %+v while the handler waits for the body, want 1 incomplete", st)
		}
		if v := yield(l); v != c {
			t.Errorf("a new connection took %v, want the one whose handler waits for its body", v)
		}
	}
	body := &onRead{Reader: strings.NewReader(`{"rule": "sms.code", "id": "x"}`), first: newcomer}
	rec := httptest.NewRecorder()
	s := &Server{log: quiet}
	if raw, ok := s.readBody(rec, httptest.NewRequestWithContext(ctx, "POST", "/v1/allow", body)); ok || rec.Body.Len() != 0 || !c.closed.Load() {
		t.Errorf("readBody on a connection given to a new one: %q %v, answered %d %q, connection closed %v; want it closed, nothing read or answered", raw, ok, rec.Code, rec.Body, c.closed.Load())
	}
	if st := l.Stats(); st.Open != 1 || st.IncompleteClosed != 1 {
		t.Errorf("stats %+v, want 1 open (the newcomer's), 1 incomplete closed", st)
	}
}

// onRead calls first before its first Read.
type onRead struct {
	io.Reader
	first func()
}

func (r *onRead) Read(p []byte) (int, error) {
	if r.first != nil {
		r.first()
		r.first = nil
	}
	return r.Reader.Read(p)
}

// TestYieldPassesOverWhatTheServerOwes: a newcomer takes the slot of the
// connection longest waiting on its client, passing over (to the back of
// the line) those whose client's bytes the server has yet to act on; when
// every one it looks at is owed, or the first maxPassOver are, the longest
// waiting of them gives way, rather than the newcomer being refused.
func TestYieldPassesOverWhatTheServerOwes(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	queued := func(l *ConnLimit, n int, owed bool) []*limitedConn {
		cs := make([]*limitedConn, n)
		for i := range cs {
			cs[i] = l.admit(pipeConn(t))
			cs[i].owed.Store(owed)
			l.mu.Lock()
			l.wait(cs[i], false)
			l.mu.Unlock()
		}
		return cs
	}

	l := NewConnLimit(4, quiet)
	owed := queued(l, 2, true)
	free := queued(l, 2, false)
	if v := yield(l); v != free[0] {
		t.Fatalf("a newcomer took %v, want the first connection the server owes nothing", v)
	}
	// The line is now free[1], then the owed two.
	free[1].owed.Store(true)
	if v := yield(l); v != free[1] {
		t.Errorf("with every connection owed, a newcomer took %v, want the longest waiting", v)
	}
	owed[1].owed.Store(false)
	if v := yield(l); v != owed[1] {
		t.Errorf("a newcomer took %v, want the one connection the server no longer owes", v)
	}

	l = NewConnLimit(maxPassOver+2, quiet)
	owed = queued(l, maxPassOver+1, true)
	free = queued(l, 1, false)
	if v := yield(l); v != owed[0] {
		t.Errorf("with the first %d connections owed, a newcomer took %v, want the longest waiting", maxPassOver, v)
	}
	// Those looked at went to the back: the next newcomer looks further.
	if v := yield(l); v != free[0] {
		t.Errorf("the next newcomer took %v, want the connection past the ones looked at", v)
	}
	if st := l.Stats(); st.IncompleteClosed != 2 || st.Incomplete != maxPassOver {
		t.Errorf("stats %+v, want 2 incomplete closed, %d incomplete left", st, maxPassOver)
	}
}
