package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countlimit/countlimit/countlimit"
)

// DefaultHealthTimeout is Config.HealthTimeout's default: under the 1 s a
// Kubernetes probe waits by default.
const DefaultHealthTimeout = 900 * time.Millisecond

// DefaultFailureMemory is Config.FailureMemory's default.
const DefaultFailureMemory = 10 * time.Second

// storeState tracks whether the store is up from the outcomes of checks and
// of /healthz pings, and logs one line per transition ("store unavailable",
// "store is back"), never one per failing request: an outage of a busy
// service would otherwise bury the log. It is safe for concurrent use; while
// the store is up, ok costs one atomic load.
type storeState struct {
	log    *slog.Logger
	now    func() time.Time
	gauge  prometheus.Gauge
	isDown atomic.Bool

	mu        sync.Mutex
	since     time.Time // when the current outage began
	errs      int64     // store errors in the current outage
	lastCheck time.Time // when a check last failed because of the store
}

// startDown marks the store down from the start, logging err once.
func (t *storeState) startDown(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.isDown.Store(true)
	t.gauge.Set(0)
	t.since, t.errs = t.now(), 1
	t.log.Warn("store unavailable at start; serving, unhealthy until it answers", "err", err)
}

// fail records a store error met by source (an endpoint, or "healthz").
func (t *storeState) fail(source string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if source != "healthz" {
		t.lastCheck = now
	}
	t.errs++
	if t.isDown.Load() {
		return
	}
	t.isDown.Store(true)
	t.gauge.Set(0)
	t.since, t.errs = now, 1
	t.log.Error("store unavailable", "source", source, "err", err)
}

// ok records that a check succeeded.
func (t *storeState) ok() {
	if !t.isDown.Load() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.up()
}

// pinged records that a health ping succeeded, and reports whether the
// store now counts as up. A ping that answers does not end an outage that
// checks still see: a check may fail where a ping succeeds (a stuck batch,
// a locked row, a full pool), so the store stays down until a check
// succeeds or memory passes without a failing one.
func (t *storeState) pinged(memory time.Duration) bool {
	if !t.isDown.Load() {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.lastCheck.IsZero() && t.now().Sub(t.lastCheck) < memory {
		return false
	}
	t.up()
	return true
}

// up ends the outage, if any. t.mu is held.
func (t *storeState) up() {
	if !t.isDown.Load() {
		return
	}
	t.isDown.Store(false)
	t.gauge.Set(1)
	t.log.Info("store is back", "down_for", t.now().Sub(t.since).Round(time.Millisecond).String(), "errors", t.errs)
	t.since, t.errs, t.lastCheck = time.Time{}, 0, time.Time{}
}

// outage returns when the current outage began and its store errors so far.
func (t *storeState) outage() (time.Time, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.since, t.errs
}

// pinger runs Config.Ping, then Config.Settings and Config.Warnings, for
// /healthz, one ping at a time: concurrent probes share the ping in
// flight, so a store that hangs (or a ping that ignores its context) costs
// one goroutine, not one per probe.
type pinger struct {
	ping     func(context.Context) error    // nil: none
	settings func(context.Context) error    // nil: none
	warnings func(context.Context) []string // nil: none
	timeout  time.Duration

	mu   sync.Mutex
	call *pingCall
}

type pingCall struct {
	done     chan struct{}
	warnings []string
	err      error
}

// errPingTimeout is what a ping that did not answer in time fails with.
var errPingTimeout = fmt.Errorf("store ping: %w", context.DeadlineExceeded)

// do pings the store, or waits for the ping in flight, for at most the
// timeout, and returns its warnings and error.
func (p *pinger) do(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	c := p.call
	if c == nil {
		c = &pingCall{done: make(chan struct{})}
		p.call = c
		go func() {
			pctx, cancel := context.WithTimeout(context.Background(), p.timeout)
			defer cancel()
			c.warnings, c.err = p.check(pctx)
			p.mu.Lock()
			p.call = nil
			p.mu.Unlock()
			close(c.done)
		}()
	}
	p.mu.Unlock()
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	select {
	case <-c.done:
		return c.warnings, c.err
	case <-timer.C:
		return nil, errPingTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// check pings the store, then asks its settings and its warnings: a store
// that fails the ping has neither.
func (p *pinger) check(ctx context.Context) (warnings []string, err error) {
	if p.ping != nil {
		if err := p.ping(ctx); err != nil {
			return nil, err
		}
	}
	if p.settings != nil {
		if serr := p.settings(ctx); serr != nil {
			err = &settingsError{serr}
		}
	}
	if p.warnings != nil {
		warnings = p.warnings(ctx)
	}
	return warnings, err
}

// settingsError is Config.Settings' error: the store answers, but a
// setting of it breaks the limits' guarantees.
type settingsError struct{ err error }

func (e *settingsError) Error() string { return e.err.Error() }
func (e *settingsError) Unwrap() error { return e.err }

// healthResponse is /healthz's body.
type healthResponse struct {
	Status string `json:"status"` // ok or unavailable
	Error  string `json:"error,omitempty"`
	// Reason says why, without the store's own error text (addresses,
	// user names): /healthz needs no token. The log has the details.
	Reason string `json:"reason,omitempty"`
	// Since is when the outage began.
	Since *time.Time `json:"since,omitempty"`
	// Warnings name settings of the store that put the limits at risk in
	// some event (a Redis that persists nothing loses every count when it
	// restarts) but break nothing now.
	Warnings []string `json:"warnings,omitempty"`
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	var warnings []string
	unhealthy := func(reason string) {
		resp := healthResponse{Status: "unavailable", Error: "store unavailable", Reason: reason, Warnings: warnings}
		if since, _ := s.state.outage(); !since.IsZero() {
			since = since.UTC()
			resp.Since = &since
		}
		writeJSON(w, http.StatusServiceUnavailable, resp)
	}
	if s.gate != nil {
		// A store that cannot say is left to the ping.
		if err := s.gate.state(r.Context(), 0); err != nil && !errors.Is(err, countlimit.ErrUnavailable) {
			if r.Context().Err() == nil {
				writeJSON(w, http.StatusServiceUnavailable, healthResponse{Status: "unavailable", Error: "store schema not ready", Reason: err.Error()})
			}
			return
		}
	}
	if s.pinger != nil {
		var err error
		if warnings, err = s.pinger.do(r.Context()); err != nil {
			if r.Context().Err() != nil {
				return // the prober went away; the store did not fail
			}
			var bad *settingsError
			if errors.As(err, &bad) {
				writeJSON(w, http.StatusServiceUnavailable, healthResponse{Status: "unavailable", Error: "store misconfigured", Reason: bad.Error(), Warnings: warnings})
				return
			}
			s.state.fail("healthz", err)
			if errors.Is(err, context.DeadlineExceeded) {
				unhealthy(fmt.Sprintf("the store did not answer a ping within %v", s.cfg.HealthTimeout))
			} else {
				unhealthy("the store failed a ping")
			}
			return
		}
	}
	if !s.state.pinged(s.cfg.FailureMemory) {
		_, errs := s.state.outage()
		unhealthy(fmt.Sprintf("checks are failing: %d store errors in this outage", errs))
		return
	}
	writeJSON(w, http.StatusOK, healthResponse{Status: "ok", Warnings: warnings})
}
