// Package server is countlimit's HTTP JSON service: allow, peek, refund,
// reset and acquire by rule name and id, release and extend by lease, the
// rule list, /healthz and Prometheus /metrics.
//
// A verdict is 200 whether allowed or denied: the caller is a backend asking
// a question, and "no" is an answer. Bad requests are 400 with a JSON error
// naming the field; an extend of a lease no longer held is 409; a failing
// store is 503; a missing or wrong bearer token, when one is configured, is
// 401.
package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/promlimit"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/ruleops"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 64 << 10

// Config is what a Server serves.
type Config struct {
	Limiter *countlimit.Limiter
	// Metrics is what /metrics shows of the Limiter: its store calls'
	// durations, failures and fallbacks, fed by the Limiter's observer
	// (make both with NewMetrics), and its circuit breaker's state, fed by
	// the breaker's OnChange (Metrics.BreakerChanged). Nil: a Metrics of
	// the server's own, which shows the decisions only.
	Metrics *promlimit.Metrics
	Rules   *rulefile.File
	// Ping reports whether the store answers; nil means healthy unless
	// checks fail.
	Ping func(context.Context) error
	// Settings, when set, reports a setting of the store that breaks the
	// limits' guarantees though the store answers: a Redis whose
	// maxmemory-policy evicts counters (redisstore's CheckEviction).
	// /healthz calls it after each ping that succeeds, within
	// HealthTimeout, so it must be cheap. While it fails, /healthz answers
	// 503 with its error's text as the reason, which must so name no
	// address or user. It is no outage: checks go on, and nothing is logged.
	Settings func(context.Context) error
	// Warnings, when set, reports settings of the store that put the
	// limits at risk in some event without breaking them now: a Redis that
	// persists nothing forgets every count when it restarts (redisstore's
	// CheckPersistence). /healthz calls it after Settings, lists what it
	// returns under "warnings" and stays 200; the texts, like Settings',
	// must name no address or user.
	Warnings func(context.Context) []string
	// Schema, when set, says whether the store's schema is ready for this
	// release: nil once it is; an error wrapping countlimit.ErrUnavailable
	// when the store failed to say; any other error when the store
	// answered that it is not (a PostgreSQL database behind the release's
	// migrations), its text saying what to run and naming no address or
	// user. Until it returns nil, checks answer 503 with that text (or
	// "store unavailable") without calling the store, whose schema may not
	// decide as this release does, and /healthz answers 503 with it as the
	// reason. The server asks it at each /healthz, and for checks at most
	// once a second, within HealthTimeout; once it returns nil, never
	// again. Nil: the schema is ready.
	Schema func(context.Context) error
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// StoreTimeout bounds each request's calls to the store (default
	// DefaultStoreTimeout): a stuck store gets 503, not a hung client.
	StoreTimeout time.Duration
	// Token, when not empty, is the bearer token that every endpoint but
	// /healthz requires ("Authorization: Bearer <token>"), /metrics
	// included. Empty means no authentication.
	Token string
	// OmitMetrics leaves /metrics out of the handler, for a service that
	// serves Metrics() on an address of its own.
	OmitMetrics bool
	// HealthTimeout bounds /healthz's store ping (default
	// DefaultHealthTimeout); a ping that does not answer in time is a 503.
	HealthTimeout time.Duration
	// FailureMemory is how long a check that failed because of the store
	// keeps /healthz at 503 even though the ping answers (default
	// DefaultFailureMemory). A successful check ends it sooner.
	FailureMemory time.Duration
	// StartErr is the store's error when it did not answer at start: the
	// service then starts unhealthy, logs it once, and turns healthy when
	// the store answers. Nil means the store answered.
	StartErr error
	// Conns, when not nil, is the cap on the connections the service's
	// listeners hold open; /metrics then shows it at work.
	Conns *ConnLimit
	// Purges, when not nil, records the service's background purges of
	// expired rows; /metrics then shows them. Nil: the service does not
	// purge (memory and Redis counters expire on their own).
	Purges *Purges
}

// NewMetrics returns the Metrics for Config.Metrics and the option that
// makes a Limiter feed them its store calls (give Metrics.BreakerChanged
// to its circuit breaker's OnChange too). They are promlimit's, which an
// application embedding a Limiter exports too, so the service's names and
// labels are the library's; but the service counts decisions itself, once
// per request under the rule or group the request names, not once per
// rule under its use type, so the observer leaves them out.
func NewMetrics() (*promlimit.Metrics, countlimit.Option) {
	m := promlimit.New()
	o := m.Observer()
	o.Decided = nil
	return m, countlimit.WithObserver(o)
}

// connCollectors export what a ConnLimit does at its cap.
func connCollectors(l *ConnLimit) []prometheus.Collector {
	gauge := func(name, help string, v func(ConnStats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(v(l.Stats())) })
	}
	counter := func(name, help string, v func(ConnStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(v(l.Stats())) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "countlimit_http_connections_max",
			Help: "The cap on open HTTP connections (--max-conns).",
		}, func() float64 { return float64(l.Max()) }),
		gauge("countlimit_http_connections_open", "HTTP connections open.",
			func(s ConnStats) int { return s.Open }),
		gauge("countlimit_http_connections_idle", "Open HTTP connections idle between requests.",
			func(s ConnStats) int { return s.Idle }),
		gauge("countlimit_http_connections_incomplete", "Open HTTP connections whose request is incomplete: new, silent, or sending its request line, headers or body.",
			func(s ConnStats) int { return s.Incomplete }),
		counter("countlimit_http_connections_idle_closed_total", "Idle HTTP connections closed to make room for new ones.",
			func(s ConnStats) uint64 { return s.IdleClosed }),
		counter("countlimit_http_connections_incomplete_closed_total", "HTTP connections whose request was incomplete closed to make room for new ones.",
			func(s ConnStats) uint64 { return s.IncompleteClosed }),
		counter("countlimit_http_connections_refused_total", "New HTTP connections refused (503) at the cap with every one at work on a request.",
			func(s ConnStats) uint64 { return s.Refused }),
	}
}

// DefaultStoreTimeout is Config.StoreTimeout's default.
const DefaultStoreTimeout = 5 * time.Second

// Server is the HTTP handler. It is safe for concurrent use.
type Server struct {
	cfg    Config
	log    *slog.Logger
	mux    *http.ServeMux
	token  *[sha256.Size]byte // nil: no authentication
	state  *storeState
	pinger *pinger     // nil: no Ping
	gate   *schemaGate // nil: no Schema
	reg    *prometheus.Registry
	lim    *promlimit.Metrics // the Limiter's metrics
	// decided counts a request's decision in lim, under the rule or
	// group it names (its Observer's Decided).
	decided func(countlimit.Decision)
	latency *prometheus.HistogramVec
	failed  *prometheus.CounterVec
}

// New returns a Server for cfg.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), reg: prometheus.NewRegistry()}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.cfg.StoreTimeout <= 0 {
		s.cfg.StoreTimeout = DefaultStoreTimeout
	}
	if s.cfg.HealthTimeout <= 0 {
		s.cfg.HealthTimeout = DefaultHealthTimeout
	}
	if s.cfg.FailureMemory <= 0 {
		s.cfg.FailureMemory = DefaultFailureMemory
	}
	if cfg.Token != "" {
		sum := sha256.Sum256([]byte(cfg.Token))
		s.token = &sum
	}
	if cfg.Ping != nil || cfg.Settings != nil || cfg.Warnings != nil {
		s.pinger = &pinger{ping: cfg.Ping, settings: cfg.Settings, warnings: cfg.Warnings, timeout: s.cfg.HealthTimeout}
	}
	if cfg.Schema != nil {
		s.gate = &schemaGate{ask: cfg.Schema, timeout: s.cfg.HealthTimeout, log: s.log}
	}
	s.lim = cfg.Metrics
	if s.lim == nil {
		s.lim = promlimit.New()
	}
	s.decided = s.lim.Observer().Decided
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "countlimit_request_duration_seconds",
		Help:    "Time to answer an API request, by endpoint.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"endpoint"})
	s.failed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "countlimit_store_errors_total",
		Help: "Requests that failed because the store did, by endpoint.",
	}, []string{"endpoint"})
	up := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "countlimit_store_up",
		Help: "1 while the store answers, 0 during an outage (a failing check or /healthz ping).",
	})
	up.Set(1)
	s.state = &storeState{log: s.log, now: time.Now, gauge: up}
	if cfg.StartErr != nil {
		s.state.startDown(cfg.StartErr)
	}
	s.reg.MustRegister(s.lim, s.latency, s.failed, up,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if cfg.Conns != nil {
		s.reg.MustRegister(connCollectors(cfg.Conns)...)
	}
	if cfg.Purges != nil {
		s.reg.MustRegister(cfg.Purges.collectors()...)
	}

	for _, o := range ruleops.Ops {
		h := s.check(o)
		switch {
		case o == driver.OpAcquire:
			h = s.acquire
		case ruleops.IsLeaseOp(o):
			h = s.lease(o)
		}
		s.mux.HandleFunc("POST /v1/"+o.String(), s.timed(o.String(), h))
		s.failed.WithLabelValues(o.String()) // present at 0 before the first failure
	}
	s.mux.HandleFunc("GET /v1/rules", s.rules)
	s.mux.HandleFunc("GET /healthz", s.health)
	if !cfg.OmitMetrics {
		s.mux.Handle("GET /metrics", s.metrics())
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && cfg.OmitMetrics {
			writeJSON(w, http.StatusNotFound, apiError{Error: "no such endpoint: /metrics is served on its own address"})
			return
		}
		if m, ok := methods[r.URL.Path]; ok {
			w.Header().Set("Allow", m)
			writeJSON(w, http.StatusMethodNotAllowed, apiError{Error: r.URL.Path + " takes " + m})
			return
		}
		writeJSON(w, http.StatusNotFound, apiError{Error: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return s
}

// methods maps each endpoint to its method, for 405 answers.
var methods = map[string]string{
	"/v1/allow": "POST", "/v1/peek": "POST", "/v1/refund": "POST", "/v1/reset": "POST",
	"/v1/acquire": "POST", "/v1/release": "POST", "/v1/extend": "POST",
	"/v1/rules": "GET", "/healthz": "GET", "/metrics": "GET",
}

// ServeHTTP implements http.Handler. With a token, every request but
// GET /healthz must carry it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.token != nil && r.URL.Path != "/healthz" && !s.authorized(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Metrics returns a handler that serves GET /metrics alone, with no
// authentication: for a listener of its own (see Config.OmitMetrics), on
// an address that only the scraper reaches.
func (s *Server) Metrics() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.metrics())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{Error: "no such endpoint: " + r.Method + " " + r.URL.Path + " (this address serves GET /metrics)"})
	})
	return mux
}

func (s *Server) metrics() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
}

func (s *Server) timed(endpoint string, h http.HandlerFunc) http.HandlerFunc {
	obs := s.latency.WithLabelValues(endpoint)
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h(w, r)
		obs.Observe(time.Since(start).Seconds())
	}
}

// Request is the body of POST /v1/allow, /v1/peek, /v1/refund, /v1/reset
// and /v1/acquire.
type Request struct {
	Rule string `json:"rule"`
	ID   string `json:"id"`
	// Cost is the event's weight for allow, and what refund gives back;
	// default 1. The other operations take none.
	Cost *int64 `json:"cost,omitempty"`
	// Tier picks the rule's per-tier limit.
	Tier string `json:"tier,omitempty"`
}

// LeaseRequest is the body of POST /v1/release and /v1/extend.
type LeaseRequest struct {
	// Lease is the lease string /v1/acquire returned.
	Lease string `json:"lease"`
	// Rule and ID are optional; when given they must be the lease's own.
	Rule string `json:"rule,omitempty"`
	ID   string `json:"id,omitempty"`
}

type apiError struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

func (s *Server) check(o driver.Op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req, rules, ok := s.decode(w, r, o)
		if !ok || !s.schemaReady(w, r) {
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
		defer cancel()
		results, err := ruleops.Do(ctx, s.cfg.Limiter, o, rules, req.ID, *req.Cost)
		if err != nil {
			s.fail(w, r, o.String(), req.Rule, err)
			return
		}
		s.state.ok()
		if o == driver.OpReset {
			writeJSON(w, http.StatusOK, map[string]any{"reset": true})
			return
		}
		resp := ruleops.NewResponse(s.cfg.Rules.Members(req.Rule), rules, results)
		if o == driver.OpRefund {
			resp.Refunded = *req.Cost
		}
		if o == driver.OpAllow {
			s.decide(o, req.Rule, resp.Allowed)
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

// decide counts a request's decision once, under the rule or group it
// names: the metrics' rule label is the request's name, not the use types
// of the rules it stands for. rule comes from the rule file, a bounded set.
func (s *Server) decide(op driver.Op, rule string, allowed bool) {
	s.decided(countlimit.Decision{UseType: countlimit.UseType(rule), Allowed: allowed})
}

// acquire takes a slot of a rule with a concurrent window: the answer is
// allow's, with the lease string when allowed.
func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	req, rules, ok := s.decode(w, r, driver.OpAcquire)
	if !ok || !s.schemaReady(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	ls, results, err := ruleops.Acquire(ctx, s.cfg.Limiter, rules, req.ID)
	if err != nil {
		s.fail(w, r, driver.OpAcquire.String(), req.Rule, err)
		return
	}
	s.state.ok()
	resp := ruleops.NewAcquireResponse(req.Rule, rules, results, ls)
	s.decide(driver.OpAcquire, req.Rule, resp.Allowed)
	writeJSON(w, http.StatusOK, resp)
}

// lease releases or extends the lease a request names. Release is
// idempotent; an extend of a lease no longer held is 409.
func (s *Server) lease(o driver.Op) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var wire wireLeaseRequest
		if !s.readJSON(w, r, &wire, `{"lease": "<the lease string /v1/acquire returned>"}`) {
			return
		}
		var req LeaseRequest
		for _, f := range []struct {
			name string
			raw  json.RawMessage
			dst  *string
		}{{"lease", wire.Lease, &req.Lease}, {"rule", wire.Rule, &req.Rule}, {"id", wire.ID, &req.ID}} {
			if err := jsonString(f.raw, f.dst); err != nil {
				writeJSON(w, http.StatusBadRequest, apiError{Error: fmt.Sprintf("%s %v", f.name, err), Field: f.name})
				return
			}
		}
		ls, err := ruleops.ParseLease(s.cfg.Limiter, s.cfg.Rules, req.Lease, req.Rule, req.ID)
		if err != nil {
			field := "lease"
			if fe := (*ruleops.FieldError)(nil); errors.As(err, &fe) {
				field = fe.Field
			}
			writeJSON(w, http.StatusBadRequest, apiError{Error: err.Error(), Field: field})
			return
		}
		if !s.schemaReady(w, r) {
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
		defer cancel()
		err = ruleops.DoLease(ctx, o, ls)
		switch {
		case errors.Is(err, countlimit.ErrLeaseExpired):
			s.state.ok()
			writeJSON(w, http.StatusConflict, apiError{Error: "lease expired or released: its slot may be someone else's now; stop the work, or acquire a new lease", Field: "lease"})
			return
		case err != nil:
			s.fail(w, r, o.String(), string(expose.LeaseUseType(ls)), err)
			return
		}
		s.state.ok()
		writeJSON(w, http.StatusOK, ruleops.NewLeaseResponse(o, ls))
	}
}

// readJSON reads a body that holds one JSON object into v, a pointer to a
// struct of the fields the endpoint takes, answering 4xx itself when it
// cannot. Each member must name one of v's fields exactly, once (see
// exactFields). example shows the body an empty request lacks.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any, example string) bool {
	raw, ok := s.readBody(w, r)
	if !ok {
		return false
	}
	if fe := exactFields(raw, jsonNames(v)); fe != nil {
		writeJSON(w, http.StatusBadRequest, apiError{Error: "bad JSON: " + fe.Error(), Field: fe.field})
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		switch {
		case errors.Is(err, io.EOF):
			writeJSON(w, http.StatusBadRequest, apiError{Error: "empty body: want JSON like " + example})
		default:
			field := ""
			if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
				field = strings.Trim(f, `"`)
			}
			var ute *json.UnmarshalTypeError
			if errors.As(err, &ute) {
				field = ute.Field
			}
			writeJSON(w, http.StatusBadRequest, apiError{Error: "bad JSON: " + err.Error(), Field: field})
		}
		return false
	}
	if trailing(raw, dec.InputOffset()) {
		writeJSON(w, http.StatusBadRequest, apiError{Error: "bad JSON: more than one value in the body"})
		return false
	}
	return true
}

// decode reads and checks a request, answering 4xx itself when it is bad.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, o driver.Op) (Request, []countlimit.Rule, bool) {
	var req Request
	var wire wireRequest
	if !s.readJSON(w, r, &wire, `{"rule": "sms.code", "id": "18500000000"}`) {
		return req, nil, false
	}
	bad := func(field, format string, args ...any) (Request, []countlimit.Rule, bool) {
		writeJSON(w, http.StatusBadRequest, apiError{Error: fmt.Sprintf(format, args...), Field: field})
		return req, nil, false
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *string
	}{{"rule", wire.Rule, &req.Rule}, {"id", wire.ID, &req.ID}, {"tier", wire.Tier, &req.Tier}} {
		if err := jsonString(f.raw, f.dst); err != nil {
			return bad(f.name, "%s %v", f.name, err)
		}
	}
	req.Cost = wire.Cost
	if req.Rule == "" {
		return bad("rule", "rule is required")
	}
	if err := expose.ValidateID(req.ID); err != nil {
		return bad("id", "%v", err)
	}
	costSet := req.Cost != nil
	if !costSet {
		one := int64(1)
		req.Cost = &one
	}
	if err := ruleops.CheckCost(s.cfg.Rules, o, req.Rule, *req.Cost, costSet); err != nil {
		return bad("cost", "%v", err)
	}
	rules, err := ruleops.Resolve(s.cfg.Rules, o, req.Rule, req.Tier)
	var fe *ruleops.FieldError
	switch {
	case errors.Is(err, rulefile.ErrUnknown):
		return bad("rule", "unknown rule %q (GET /v1/rules lists them)", req.Rule)
	case errors.Is(err, rulefile.ErrTier):
		return bad("tier", "%v", err)
	case errors.As(err, &fe):
		return bad(fe.Field, "%v", fe)
	case err != nil:
		return bad("rule", "%v", err)
	}
	return req, rules, true
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, endpoint, rule string, err error) {
	if errors.Is(err, countlimit.ErrInvalid) {
		writeJSON(w, http.StatusBadRequest, apiError{Error: err.Error()})
		return
	}
	if r.Context().Err() != nil {
		// The client went away; the store did not fail.
		s.log.Debug("client gone", "endpoint", endpoint, "rule", rule)
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "request canceled"})
		return
	}
	if errors.Is(err, countlimit.ErrLocked) {
		// Another transaction holds the id (a check inside an application's
		// own transaction): the store is up, and the other ids are served.
		s.log.Debug("id locked by another transaction", "endpoint", endpoint, "rule", rule, "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "id locked by another transaction; try again"})
		return
	}
	s.failed.WithLabelValues(endpoint).Inc()
	s.state.fail(endpoint, err) // logs the outage once, not every request
	s.log.Debug("store failed", "endpoint", endpoint, "rule", rule, "err", err)
	writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "store unavailable"})
}

func (s *Server) rules(w http.ResponseWriter, _ *http.Request) {
	type ruleInfo struct {
		Name        string           `json:"name"`
		Description string           `json:"description,omitempty"`
		UseType     string           `json:"use_type,omitempty"`
		Window      string           `json:"window,omitempty"`
		Limit       *int64           `json:"limit,omitempty"`
		Tiers       map[string]int64 `json:"tiers,omitempty"`
		Block       string           `json:"block,omitempty"`
		Rules       []string         `json:"rules,omitempty"`
	}
	out := []ruleInfo{}
	for _, n := range s.cfg.Rules.Names() {
		if r, ok := s.cfg.Rules.Rules[n]; ok {
			ri := ruleInfo{Name: n, Description: r.Description, UseType: string(r.UseType), Window: r.WindowText, Limit: r.Limit, Tiers: r.Tiers}
			if r.Block > 0 {
				ri.Block = r.Block.String()
			}
			out = append(out, ri)
			continue
		}
		g := s.cfg.Rules.Groups[n]
		out = append(out, ruleInfo{Name: n, Description: g.Description, Rules: g.Rules})
	}
	writeJSON(w, http.StatusOK, map[string]any{"rules": out})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
