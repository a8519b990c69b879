// Package promlimit exports what a countlimit.Limiter sees as Prometheus
// metrics, under the names and labels the countlimit service's /metrics
// uses, so one dashboard serves both (the service is built on this
// package):
//
//	countlimit_decisions_total{rule,verdict}   decisions, by use type and verdict ("allowed", "denied")
//	countlimit_waits_total{rule}               Waits that slept or waited in line before their decision, by use type
//	countlimit_store_duration_seconds{op}      store calls' durations, by operation ("allow", "peek", ...)
//	countlimit_store_failures_total            store calls that failed (timeouts included)
//	countlimit_store_timeouts_total            store calls that ran out of the store timeout
//	countlimit_locked_total                    checks that waited out a lock another transaction held
//	countlimit_breaker_state                   the circuit breaker: 0 closed, 1 open, 2 half-open
//	countlimit_breaker_openings_total          times the circuit breaker opened
//	countlimit_breaker_rejected_total          checks the open breaker answered without the store
//	countlimit_fallback_decisions_total        checks the fallback store answered
//
// All come from the Limiter's Observer, which tells each decision and
// store call as it happens (a Wait, WaitN or WaitAcquire is one decision
// however many times it asked the store, and, when it slept or waited in
// line first, one wait too), but for the breaker's two, which its
// OnChange tells ([Metrics.BreakerChanged]). Make a Metrics with New,
// register it and give its Observer to the Limiter, and BreakerChanged to
// the circuit breaker if it has one:
//
//	metrics := promlimit.New()
//	prometheus.MustRegister(metrics)
//	limiter := countlimit.New(store, countlimit.WithObserver(metrics.Observer()),
//		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{OnChange: metrics.BreakerChanged}))
//
// No id ever becomes a label: the Observer is never told one, and no
// error's text becomes one either. The labels' values are use types and
// operation names, so the series are as many as the use types, whatever
// the traffic. An application whose use types are not a fixed set (a use
// type per tenant, per customer's API key) bounds them with
// [MaxRuleLabels], past which new ones are counted together under
// [OtherRule]. A new use type costs the same however many came before.
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
	buckets  []float64
	maxRules int
}

// Buckets sets the upper bounds, in seconds, of
// countlimit_store_duration_seconds' buckets (default [DefaultBuckets]).
func Buckets(b ...float64) Option {
	return func(c *config) { c.buckets = b }
}

// OtherRule is the rule label under which [MaxRuleLabels] counts the
// decisions of the rules past its bound. A rule of that name shares its
// series with them.
const OtherRule = "other"

// MaxRuleLabels bounds how many values countlimit_decisions_total's rule
// label takes (by default there is no bound; n <= 0 removes it). The first
// n distinct rules (use types, or the names given to [Metrics.Decided])
// each have their series, as without the bound, for as long as m lives;
// the decisions of every rule after them are counted together under
// rule=[OtherRule], whose series appear once the bound is reached. Each
// series costs the Prometheus server a time series to keep, and m the
// memory of two counters: set it when the use types are not a fixed set
// (chosen by callers, one per tenant), so that they cannot grow without
// bound. The countlimit service needs none: its rules come from its rule
// file.
func MaxRuleLabels(n int) Option {
	return func(c *config) { c.maxRules = n }
}

// Metrics is a prometheus.Collector of what a Limiter sees: the decisions
// and store calls its Observer tells, and the changes of state its circuit
// breaker tells [Metrics.BreakerChanged]. It is safe for concurrent use.
// One Observer may be given to several Limiters, whose decisions and store
// calls then add up; but a breaker's state is no sum. To watch several
// Limiters apart, make a Metrics for each and register them with a label
// that tells them apart (prometheus.WrapRegistererWith).
type Metrics struct {
	decisions *prometheus.CounterVec
	waits     *prometheus.CounterVec
	// rules maps a rule label to its allowed, denied and waited counters: a copy
	// of all, read without a lock on every decision. A decision that
	// misses it looks in all, and all is copied here again once as many
	// decisions have missed as all holds: a new rule costs constant time
	// on average however many came before (as sync.Map's read map once
	// did), and a rule's decisions go on missing for no longer than that.
	rules atomic.Pointer[map[string]*[3]prometheus.Counter]
	// other is OtherRule's counters once MaxRuleLabels' bound is reached,
	// nil before. By then rules holds every rule with a series of its own,
	// so a decision of a rule missing there is counted here without
	// taking rulesMu.
	other atomic.Pointer[[3]prometheus.Counter]
	// rulesMu guards all and misses.
	rulesMu sync.Mutex
	all     map[string]*[3]prometheus.Counter
	misses  int
	// maxRules is MaxRuleLabels' bound; 0 for none.
	maxRules int

	storeSeconds *prometheus.HistogramVec
	byOp         [driver.OpExtend + 1]prometheus.Observer

	// What the failure options did, told by the Observer's StoreCalled
	// and by BreakerChanged.
	failures, timeouts, locked, rejected, fallbacks, openings prometheus.Counter
	breakerState                                              prometheus.Gauge
}

// New returns a Metrics with every count at 0 and the breaker closed.
func New(opts ...Option) *Metrics {
	cfg := config{buckets: DefaultBuckets}
	for _, o := range opts {
		o(&cfg)
	}
	m := &Metrics{
		all:      map[string]*[3]prometheus.Counter{},
		maxRules: max(0, cfg.maxRules),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "countlimit_decisions_total",
			Help: "Checks answered, by rule (the Limiter's use type; the service's rule or group) and verdict (allowed, denied).",
		}, []string{"rule", "verdict"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "countlimit_waits_total",
			Help: "Waits (Wait, WaitN, WaitAcquire) that slept or waited in line before their decision, by rule; each is one decision in countlimit_decisions_total, however many times it asked the store.",
		}, []string{"rule"}),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "countlimit_store_duration_seconds",
			Help:    "Time the store took to answer or fail a call, by operation.",
			Buckets: cfg.buckets,
		}, []string{"op"}),
	}
	for _, op := range ops {
		m.byOp[op] = m.storeSeconds.WithLabelValues(op.String())
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m.failures = counter("countlimit_store_failures_total", "Store calls that failed (timeouts included).")
	m.timeouts = counter("countlimit_store_timeouts_total", "Store calls that ran out of the store timeout (WithStoreTimeout, --store-timeout).")
	m.rejected = counter("countlimit_breaker_rejected_total", "Checks the open circuit breaker answered without calling the store.")
	m.openings = counter("countlimit_breaker_openings_total", "Times the circuit breaker opened.")
	m.fallbacks = counter("countlimit_fallback_decisions_total", "Checks the fallback store answered.")
	m.locked = counter("countlimit_locked_total", "Checks that waited out their time for an id another transaction held locked (PostgreSQL).")
	m.breakerState = prometheus.NewGauge(prometheus.GaugeOpts{Name: "countlimit_breaker_state", Help: "The circuit breaker: 0 closed, 1 open, 2 half-open."})
	m.rules.Store(&map[string]*[3]prometheus.Counter{})
	return m
}

// Observer returns the countlimit.Observer that feeds m's decisions,
// waits, store durations, failures, timeouts, locked calls, the calls the
// open breaker refused and those the fallback store answered, for
// countlimit.WithObserver. Its funcs allocate nothing once a use type has
// been seen.
func (m *Metrics) Observer() countlimit.Observer {
	return countlimit.Observer{
		Decided: func(d countlimit.Decision) {
			c := m.lookup(string(d.UseType))
			if d.Allowed {
				c[0].Inc()
			} else {
				c[1].Inc()
			}
			if d.Waited {
				c[2].Inc()
			}
		},
		StoreCalled: func(c countlimit.StoreCall) {
			switch {
			case c.Fallback:
				if c.Err == nil {
					m.fallbacks.Inc()
				}
				return
			case c.Err != nil && errors.Is(c.Err, countlimit.ErrCircuitOpen):
				m.rejected.Inc()
				return
			}
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
	}
}

// BreakerChanged exports a circuit breaker's change of state, for its
// countlimit.CircuitBreaker.OnChange: countlimit_breaker_state and
// countlimit_breaker_openings_total. A breaker tells its changes one at a
// time, in order.
func (m *Metrics) BreakerChanged(_, to countlimit.BreakerState) {
	m.breakerState.Set(float64(to))
	if to == countlimit.BreakerOpen {
		m.openings.Inc()
	}
}

// lookup returns the counters of rule: allowed, denied and waited.
func (m *Metrics) lookup(rule string) *[3]prometheus.Counter {
	if c, ok := (*m.rules.Load())[rule]; ok {
		return c
	}
	return m.missed(rule)
}

// missed returns the counters of a rule that rules does not hold: those
// of all, made there (both verdicts at 0) for a new rule, or past the
// bound of MaxRuleLabels, OtherRule's.
func (m *Metrics) missed(rule string) *[3]prometheus.Counter {
	if other := m.other.Load(); other != nil {
		// rules was copied from all, whole, before other was set: read it
		// again, as the copy read first may be older.
		if c, ok := (*m.rules.Load())[rule]; ok {
			return c
		}
		return other
	}
	m.rulesMu.Lock()
	defer m.rulesMu.Unlock()
	c, ok := m.all[rule]
	if !ok {
		if other := m.other.Load(); other != nil {
			return other // the bound was reached while this call waited
		}
		c = m.counters(rule)
		m.all[rule] = c
		if m.maxRules > 0 && len(m.all) >= m.maxRules {
			m.publish()
			m.other.Store(m.counters(OtherRule))
			return c
		}
	}
	if m.misses++; m.misses >= len(m.all) {
		m.publish()
	}
	return c
}

// publish makes rules a copy of all; rulesMu is held.
func (m *Metrics) publish() {
	rules := maps.Clone(m.all)
	m.rules.Store(&rules)
	m.misses = 0
}

// counters returns the allowed, denied and waited counters of rule.
func (m *Metrics) counters(rule string) *[3]prometheus.Counter {
	return &[3]prometheus.Counter{m.decisions.WithLabelValues(rule, "allowed"), m.decisions.WithLabelValues(rule, "denied"), m.waits.WithLabelValues(rule)}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.decisions.Describe(ch)
	m.waits.Describe(ch)
	m.storeSeconds.Describe(ch)
	for _, c := range m.failureSeries() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.decisions.Collect(ch)
	m.waits.Collect(ch)
	m.storeSeconds.Collect(ch)
	for _, c := range m.failureSeries() {
		c.Collect(ch)
	}
}

// failureSeries are the series of what the failure options did.
func (m *Metrics) failureSeries() [7]prometheus.Collector {
	return [7]prometheus.Collector{m.failures, m.timeouts, m.rejected, m.openings, m.fallbacks, m.locked, m.breakerState}
}
