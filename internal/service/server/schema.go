package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

// checkSchemaEvery is how often checks held back by a schema that is not
// ready ask again whether it is: /healthz asks at every probe.
const checkSchemaEvery = time.Second

// schemaGate holds checks back until Config.Schema says that the store's
// schema is ready, asking it one call at a time: concurrent requests share
// the call in flight. It is safe for concurrent use; once open, it costs
// one atomic load.
type schemaGate struct {
	ask     func(context.Context) error
	timeout time.Duration
	log     *slog.Logger
	open    atomic.Bool

	mu     sync.Mutex
	last   error         // the last answer, while not open
	asked  time.Time     // when it was last asked; zero: never
	asking chan struct{} // closed when the call in flight ends; nil when none
}

// state returns nil once the schema is ready, else the last answer
// (Config.Schema's contract says what it may be). It asks again, and
// waits for the answer, when the last one is older than maxAge (0:
// always) or an ask is in flight.
func (g *schemaGate) state(ctx context.Context, maxAge time.Duration) error {
	if g.open.Load() {
		return nil
	}
	g.mu.Lock()
	if g.asking == nil && (g.asked.IsZero() || time.Since(g.asked) >= maxAge) {
		done := make(chan struct{})
		g.asking = done
		go func() {
			actx, cancel := context.WithTimeout(context.Background(), g.timeout)
			err := g.ask(actx)
			cancel()
			g.mu.Lock()
			g.asking, g.asked, g.last = nil, time.Now(), err
			g.open.Store(err == nil)
			g.mu.Unlock()
			close(done)
			if err == nil {
				g.log.Info("the store's schema is ready: serving checks")
			}
		}()
	}
	wait := g.asking
	g.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if g.open.Load() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// schemaReady reports whether checks may call the store; when they may
// not, it has answered 503: with what to run while the schema is not
// ready, or "store unavailable" while the store cannot say.
func (s *Server) schemaReady(w http.ResponseWriter, r *http.Request) bool {
	if s.gate == nil {
		return true
	}
	err := s.gate.state(r.Context(), checkSchemaEvery)
	switch {
	case err == nil:
		return true
	case r.Context().Err() != nil:
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "request canceled"})
	case errors.Is(err, countlimit.ErrUnavailable):
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "store unavailable"})
	default:
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: err.Error()})
	}
	return false
}
