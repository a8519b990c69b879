// Package promlimit exports what a countlimit.Limiter sees as Prometheus
// metrics, under the names and labels the countlimit service's /metrics
// uses, so one dashboard serves both (the service is built on this
// package):
//
//	countlimit_decisions_total{rule,verdict}   decisions, by use type and verdict ("allowed", "denied")
//	countlimit_store_duration_seconds{op}      store calls' durations, by operation ("allow", "peek", ...)
//	countlimit_store_failures_total            store calls that failed (timeouts included)
//	countlimit_store_timeouts_total            store calls that ran out of the store timeout
//	countlimit_locked_total                    checks that waited out a lock another transaction held
//	countlimit_breaker_state                   the circuit breaker: 0 closed, 1 open, 2 half-open
//	countlimit_breaker_openings_total          times the circuit breaker opened
//	countlimit_breaker_rejected_total          checks the open breaker answered without the store
//	countlimit_fallback_decisions_total        checks the fallback store answered
//
// Make a Metrics with New, register it, and give its Observer to the
// Limiter:
//
//	metrics := promlimit.New()
//	prometheus.MustRegister(metrics)
//	limiter := countlimit.New(store, countlimit.WithObserver(metrics.Observer()))
//
// No id ever becomes a label: the Observer is never told one, and no
// error's text becomes one either. The labels'
// values are use types and operation names, bounded sets, so the series are
// as many as the use types, whatever the traffic.
//
// It is Prometheus and not OpenTelemetry because client_golang is already
// the service's dependency and most Go services' metrics library, and it
// costs an embedding application nothing it does not already import; an
// OpenTelemetry meter needs only a few funcs of a countlimit.Observer of
// its own, and an OpenTelemetry collector can scrape these.
package promlimit

import (
	"errors"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// DefaultBuckets are the upper bounds, in seconds, of
// countlimit_store_duration_seconds' buckets unless [Buckets] sets others:
// from 100µs (Redis on the same host) to 2.5s (a store past any sensible
// store timeout).
var DefaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// ops are the operations countlimit_store_duration_seconds has a series
// for, from the start.
var ops = []driver.Op{driver.OpAllow, driver.OpPeek, driver.OpRefund, driver.OpReset, driver.OpAcquire, driver.OpRelease, driver.OpExtend}

// An Option configures New.
type Option func(*config)

type config struct {
	buckets []float64
}

// Buckets sets the upper bounds, in seconds, of
// countlimit_store_duration_seconds' buckets (default [DefaultBuckets]).
func Buckets(b ...float64) Option {
	return func(c *config) { c.buckets = b }
}

// Metrics is a prometheus.Collector of what the Limiter its Observer is
// given to sees. It is safe for concurrent use. Give its Observer to one
// Limiter: countlimit_breaker_state is that Limiter's breaker. To watch
// several, make a Metrics for each and register them with a label that
// tells them apart (prometheus.WrapRegistererWith).
type Metrics struct {
	decisions *prometheus.CounterVec
	// rules maps a rule label to its allowed and denied counters: read
	// without a lock on every decision, copied to add a rule.
	rules   atomic.Pointer[map[string]*[2]prometheus.Counter]
	rulesMu sync.Mutex

	storeSeconds *prometheus.HistogramVec
	byOp         [driver.OpExtend + 1]prometheus.Observer

	failures, timeouts, locked prometheus.Counter
	openings, rejected         prometheus.Counter
	fallbacks                  prometheus.Counter
	breaker                    prometheus.Gauge
}

// New returns a Metrics with every count at 0.
func New(opts ...Option) *Metrics {
	cfg := config{buckets: DefaultBuckets}
	for _, o := range opts {
		o(&cfg)
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "countlimit_decisions_total",
			Help: "Checks answered, by rule (the Limiter's use type; the service's rule or group) and verdict (allowed, denied).",
		}, []string{"rule", "verdict"}),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "countlimit_store_duration_seconds",
			Help:    "Time the store took to answer or fail a call, by operation.",
			Buckets: cfg.buckets,
		}, []string{"op"}),
		failures:  counter("countlimit_store_failures_total", "Store calls that failed (timeouts included)."),
		timeouts:  counter("countlimit_store_timeouts_total", "Store calls that ran out of the store timeout (WithStoreTimeout, --store-timeout)."),
		rejected:  counter("countlimit_breaker_rejected_total", "Checks the open circuit breaker answered without calling the store."),
		openings:  counter("countlimit_breaker_openings_total", "Times the circuit breaker opened."),
		fallbacks: counter("countlimit_fallback_decisions_total", "Checks the fallback store answered."),
		locked:    counter("countlimit_locked_total", "Checks that waited out their time for an id another transaction held locked (PostgreSQL)."),
		breaker: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "countlimit_breaker_state",
			Help: "The circuit breaker: 0 closed, 1 open, 2 half-open.",
		}),
	}
	for _, op := range ops {
		m.byOp[op] = m.storeSeconds.WithLabelValues(op.String())
	}
	m.rules.Store(&map[string]*[2]prometheus.Counter{})
	return m
}

// Observer returns the countlimit.Observer that feeds m, for
// countlimit.WithObserver. Its funcs allocate nothing once a use type has
// been seen.
func (m *Metrics) Observer() countlimit.Observer {
	return countlimit.Observer{
		Decided: func(d countlimit.Decision) { m.Decided(string(d.UseType), d.Allowed) },
		StoreCalled: func(c countlimit.StoreCall) {
			if int(c.Op) < len(m.byOp) && m.byOp[c.Op] != nil {
				m.byOp[c.Op].Observe(c.Took.Seconds())
			}
			if c.Failed {
				m.failures.Inc()
			}
			if c.TimedOut {
				m.timeouts.Inc()
			}
			if c.Err != nil && errors.Is(c.Err, countlimit.ErrLocked) {
				m.locked.Inc()
			}
		},
		BreakerChanged: func(_, to countlimit.BreakerState) {
			m.breaker.Set(float64(to))
			if to == countlimit.BreakerOpen {
				m.openings.Inc()
			}
		},
		Rejected: func(driver.Op) { m.rejected.Inc() },
		FellBack: func(driver.Op) { m.fallbacks.Inc() },
	}
}

// Decided counts a decision under rule, as the Observer counts one under
// its rule's use type: for code that decides under names of its own (the
// service counts a group of rules once, under the group's name, and drops
// the Observer's Decided). rule becomes a label value: it must come from a
// bounded set, never be an id.
func (m *Metrics) Decided(rule string, allowed bool) {
	c, ok := (*m.rules.Load())[rule]
	if !ok {
		c = m.addRule(rule)
	}
	if allowed {
		c[0].Inc()
	} else {
		c[1].Inc()
	}
}

// addRule makes rule's counters, both verdicts at 0, and returns them.
func (m *Metrics) addRule(rule string) *[2]prometheus.Counter {
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
	old := *m.rules.Load()
	if c, ok := old[rule]; ok {
		return c
	}
	c := &[2]prometheus.Counter{m.decisions.WithLabelValues(rule, "allowed"), m.decisions.WithLabelValues(rule, "denied")}
	next := maps.Clone(old)
	next[rule] = c
	m.rules.Store(&next)
	return c
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.decisions, m.storeSeconds, m.failures, m.timeouts, m.locked,
		m.breaker, m.openings, m.rejected, m.fallbacks}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}
