package promlimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/testkit/tally"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/promlimit"
)

var errDown = errors.New("connection refused")

// flaky passes calls to a memstore after a pause, fails them while down
// is set, and holds them until their context ends while stall is.
type flaky struct {
	mem         *memstore.Store
	pause       time.Duration
	down, stall atomic.Bool
	// deny is how many of the next checks to answer as a full window,
	// whatever the memstore holds.
	deny atomic.Int64
}

func newFlaky(t testing.TB) *flaky {
	mem := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { mem.Close() })
	return &flaky{mem: mem}
}

func (f *flaky) Do(ctx context.Context, r *driver.Request) error {
	time.Sleep(f.pause)
	switch {
	case f.stall.Load():
		<-ctx.Done()
		return driver.Unavailable(ctx.Err())
	case f.down.Load():
		return driver.Unavailable(errDown)
	case r.Op == driver.OpAllow && f.deny.Add(-1) >= 0:
		for i := range r.Checks {
			c := &r.Checks[i]
			c.State = driver.State{Used: c.Limit, Begin: c.Begin, End: c.End}
		}
		return nil
	}
	return f.mem.Do(ctx, r)
}

// stubClock is a settable clock.
type stubClock struct{ ns atomic.Int64 }

func newStubClock() *stubClock {
	c := new(stubClock)
	c.ns.Store(time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *stubClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *stubClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// gather returns the value of every series of m, by "name{label=value,...}".
func gather(t *testing.T, m *promlimit.Metrics) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			name := f.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			// A counter's or gauge's value, a histogram's count.
			switch typ := f.GetType().String(); typ {
			case "COUNTER":
				out[name] = s.GetCounter().GetValue()
			case "GAUGE":
				out[name] = s.GetGauge().GetValue()
			case "HISTOGRAM":
				out[name] = float64(s.GetHistogram().GetSampleCount())
			default:
				t.Fatalf("%s is a %s", name, typ)
			}
		}
	}
	return out
}

func checkSeries(t *testing.T, step string, got map[string]float64, want map[string]float64) {
	t.Helper()
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s: %s = %v (present %v), want %v", step, name, g, ok, w)
		}
	}
}

// TestWaitsAreNotDenials: a Wait denied five times before it was allowed
// is one decision, allowed, and one wait, not five denials; an Allow
// denied is still a denial, and a Wait allowed at once no wait.
func TestWaitsAreNotDenials(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	m := promlimit.New()
	l := countlimit.New(f, countlimit.WithObserver(m.Observer()))
	ctx := context.Background()
	r := countlimit.Rule{UseType: "partner.api", Limit: 5, Window: countlimit.Fixed(time.Millisecond)}
	f.deny.Store(5) // each denial says: room in under a millisecond
	if res, err := l.Wait(ctx, r, "batch"); err != nil || !res.Allowed {
		t.Fatalf("Wait: %+v, %v", res, err)
	}
	checkSeries(t, "after a Wait denied five times", gather(t, m), map[string]float64{
		"countlimit_decisions_total{rule=partner.api,verdict=allowed}": 1,
		"countlimit_decisions_total{rule=partner.api,verdict=denied}":  0,
		"countlimit_waits_total{rule=partner.api}":                     1,
		"countlimit_store_duration_seconds{op=allow}":                  6,
	})
	f.deny.Store(1)
	if res, err := l.Allow(ctx, r, "batch"); err != nil || res.Allowed {
		t.Fatalf("Allow on a full window: %+v, %v", res, err)
	}
	if res, err := l.Wait(ctx, r, "batch"); err != nil || !res.Allowed {
		t.Fatalf("Wait with room: %+v, %v", res, err)
	}
	checkSeries(t, "after a denied Allow and a Wait with room", gather(t, m), map[string]float64{
		"countlimit_decisions_total{rule=partner.api,verdict=allowed}": 2,
		"countlimit_decisions_total{rule=partner.api,verdict=denied}":  1,
		"countlimit_waits_total{rule=partner.api}":                     1,
	})
}

// TestDecisionsByUseType: decisions are counted by use type and verdict,
// store calls by operation in the histogram, Peek decides nothing.
func TestDecisionsByUseType(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	f.pause = time.Millisecond
	m := promlimit.New()
	l := countlimit.New(f, countlimit.WithObserver(m.Observer()))
	ctx := context.Background()
	sms := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Fixed(time.Minute)}
	day := countlimit.Rule{UseType: "conversation.day", Limit: 50, Window: countlimit.Fixed(24 * time.Hour)}
	for range 3 {
		if _, err := l.Allow(ctx, sms, "18500000000"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Peek(ctx, sms, "18500000000"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AllowAll(ctx, "user-42", sms, day); err != nil {
		t.Fatal(err)
	}
	got := gather(t, m)
	checkSeries(t, "after 3 Allow, a Peek and an AllowAll", got, map[string]float64{
		"countlimit_decisions_total{rule=sms.code,verdict=allowed}":         3,
		"countlimit_decisions_total{rule=sms.code,verdict=denied}":          1,
		"countlimit_decisions_total{rule=conversation.day,verdict=allowed}": 1,
		"countlimit_decisions_total{rule=conversation.day,verdict=denied}":  0,
		"countlimit_store_duration_seconds{op=allow}":                       4,
		"countlimit_store_duration_seconds{op=peek}":                        1,
		"countlimit_store_duration_seconds{op=refund}":                      0,
	})
	// The store pauses 1ms a call: the durations say at least that much.
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != "countlimit_store_duration_seconds" {
			continue
		}
		for _, s := range fam.GetMetric() {
			h := s.GetHistogram()
			if h.GetSampleCount() > 0 && h.GetSampleSum() < float64(h.GetSampleCount())*time.Millisecond.Seconds() {
				t.Errorf("%v: %d calls took %vs in all, less than the store's pause of 1ms each", s.GetLabel(), h.GetSampleCount(), h.GetSampleSum())
			}
		}
	}
}

// failureSeries returns the values c gives the series of what the failure
// options did.
func failureSeries(c tally.Counts) map[string]float64 {
	return map[string]float64{
		"countlimit_store_failures_total":     float64(c.Failures),
		"countlimit_store_timeouts_total":     float64(c.Timeouts),
		"countlimit_locked_total":             float64(c.Locked),
		"countlimit_breaker_rejected_total":   float64(c.Rejected),
		"countlimit_fallback_decisions_total": float64(c.Fallbacks),
		"countlimit_breaker_openings_total":   float64(c.BreakerOpenings),
		"countlimit_breaker_state":            float64(c.Breaker),
	}
}

// TestFailuresBreakerFallback: store failures, timeouts, breaker changes,
// rejections and fallbacks show as the Observer and OnChange tell them,
// and the breaker's state is a gauge.
func TestFailuresBreakerFallback(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	clock := newStubClock()
	fallback := memstore.New(memstore.WithJanitorInterval(0))
	defer fallback.Close()
	m := promlimit.New()
	l := countlimit.New(f, countlimit.WithClock(clock.now), countlimit.WithObserver(m.Observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 2, CoolDown: time.Second, OnChange: m.BreakerChanged}),
		countlimit.WithStoreTimeout(time.Millisecond))
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: 10, Window: countlimit.Fixed(time.Minute)}
	allow := func() error { _, err := l.Allow(ctx, rule, "u1"); return err }

	f.down.Store(true)
	_ = allow()
	f.down.Store(false)
	f.stall.Store(true)
	_ = allow() // times out: the second failure opens the breaker
	if err := allow(); !errors.Is(err, countlimit.ErrCircuitOpen) {
		t.Fatalf("after 2 failures: %v, want ErrCircuitOpen", err)
	}
	checkSeries(t, "open", gather(t, m), failureSeries(tally.Counts{Failures: 2, Timeouts: 1, Rejected: 1,
		Breaker: countlimit.BreakerOpen, BreakerOpenings: 1}))
	checkSeries(t, "open", gather(t, m), map[string]float64{"countlimit_store_duration_seconds{op=allow}": 2})
	f.stall.Store(false)
	clock.advance(time.Second)
	if err := allow(); err != nil {
		t.Fatalf("the probe: %v", err)
	}
	checkSeries(t, "closed again", gather(t, m), failureSeries(tally.Counts{Failures: 2, Timeouts: 1, Rejected: 1,
		Breaker: countlimit.BreakerClosed, BreakerOpenings: 1}))
	checkSeries(t, "closed again", gather(t, m), map[string]float64{"countlimit_decisions_total{rule=api,verdict=allowed}": 1})

	m = promlimit.New()
	l = countlimit.New(f, countlimit.WithObserver(m.Observer()), countlimit.WithFallback(fallback))
	f.down.Store(true)
	for range 3 {
		if res, err := l.Allow(ctx, rule, "u1"); err != nil || !res.Allowed {
			t.Fatalf("Allow with a fallback: %+v, %v", res, err)
		}
	}
	checkSeries(t, "with a fallback", gather(t, m), failureSeries(tally.Counts{Failures: 3, Fallbacks: 3}))
	checkSeries(t, "with a fallback", gather(t, m), map[string]float64{
		"countlimit_decisions_total{rule=api,verdict=allowed}": 3,
		"countlimit_store_duration_seconds{op=allow}":          3, // the store's calls, not the fallback's
	})
}

// TestFailureSeriesFromTheStart: a new Metrics describes and emits every
// series of the failure options, each at 0 and the breaker closed.
func TestFailureSeriesFromTheStart(t *testing.T) {
	t.Parallel()
	m := promlimit.New()
	checkSeries(t, "new", gather(t, m), failureSeries(tally.Counts{}))
	described := map[string]bool{}
	ch := make(chan *prometheus.Desc, 16)
	m.Describe(ch)
	close(ch)
	for d := range ch {
		described[d.String()] = true
	}
	for name := range failureSeries(tally.Counts{}) {
		found := false
		for d := range described {
			found = found || strings.Contains(d, `fqName: "`+name+`"`)
		}
		if !found {
			t.Errorf("Describe leaves %s out", name)
		}
	}
}

// TestBreakerOfOneLimiter: one Metrics whose Observer two Limiters share
// adds up their decisions, and its breaker state is that of the Limiter
// whose breaker tells it (BreakerChanged), not of the other's.
func TestBreakerOfOneLimiter(t *testing.T) {
	t.Parallel()
	m := promlimit.New()
	up, down := newFlaky(t), newFlaky(t)
	down.down.Store(true)
	var other tally.Tally
	watched := countlimit.New(up, countlimit.WithObserver(m.Observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1, CoolDown: time.Hour, OnChange: m.BreakerChanged}))
	otherL := countlimit.New(down, countlimit.WithObserver(m.Observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1, CoolDown: time.Hour, OnChange: other.BreakerChanged}))
	rule := countlimit.Rule{UseType: "api", Limit: 10, Window: countlimit.Fixed(time.Minute)}
	for _, l := range []*countlimit.Limiter{watched, otherL, watched} {
		_, _ = l.Allow(context.Background(), rule, "u1")
	}
	if s := other.Counts(); s.Breaker != countlimit.BreakerOpen {
		t.Fatalf("the other Limiter's breaker is %v, want open", s.Breaker)
	}
	checkSeries(t, "the other's breaker open", gather(t, m), map[string]float64{
		"countlimit_decisions_total{rule=api,verdict=allowed}": 2,
		"countlimit_store_duration_seconds{op=allow}":          3,
		"countlimit_breaker_state":                             0,
		"countlimit_breaker_openings_total":                    0,
		"countlimit_store_failures_total":                      1,
	})
}

// TestBreakerChangedWhileScraping: BreakerChanged and scrapes from many
// goroutines at once are safe (under -race), every scrape shows a state
// that was told, and every opening is counted.
func TestBreakerChangedWhileScraping(t *testing.T) {
	t.Parallel()
	m := promlimit.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 50 {
				if g%2 == 0 {
					m.BreakerChanged(countlimit.BreakerClosed, countlimit.BreakerOpen)
					m.BreakerChanged(countlimit.BreakerOpen, countlimit.BreakerHalfOpen)
					continue
				}
				families, err := reg.Gather()
				if err != nil {
					t.Error(err)
					return
				}
				for _, f := range families {
					if f.GetName() == "countlimit_breaker_state" && f.GetMetric()[0].GetGauge().GetValue() > 2 {
						t.Errorf("a scrape showed breaker state %v", f.GetMetric()[0].GetGauge().GetValue())
					}
				}
			}
		})
	}
	wg.Wait()
	checkSeries(t, "after", gather(t, m), map[string]float64{"countlimit_breaker_openings_total": 4 * 50, "countlimit_breaker_state": 2})
}

// lockedStore answers as pgstore does for a row another transaction
// holds: it waits until the call's context ends, then fails with
// ErrLocked.
type lockedStore struct{}

func (lockedStore) Do(ctx context.Context, _ *driver.Request) error {
	<-ctx.Done()
	return fmt.Errorf("%w: %w", countlimit.ErrLocked, ctx.Err())
}

// TestLockedIsNoFailure: a check that waited out a lock shows as locked,
// not as a store failure or timeout.
func TestLockedIsNoFailure(t *testing.T) {
	t.Parallel()
	m := promlimit.New()
	l := countlimit.New(lockedStore{}, countlimit.WithObserver(m.Observer()), countlimit.WithStoreTimeout(time.Millisecond))
	for range 2 {
		if _, err := l.Allow(context.Background(), countlimit.Rule{UseType: "api", Limit: 1, Window: countlimit.Fixed(time.Minute)}, "u1"); !errors.Is(err, countlimit.ErrLocked) {
			t.Fatalf("Allow of a locked id: %v", err)
		}
	}
	checkSeries(t, "locked", gather(t, m), failureSeries(tally.Counts{Locked: 2}))
}

// TestIDsAreNeverLabels: ten thousand ids make as many series as ten, and
// no label holds an id.
func TestIDsAreNeverLabels(t *testing.T) {
	t.Parallel()
	series := func(ids int) (int, map[string]float64) {
		f := newFlaky(t)
		m := promlimit.New()
		l := countlimit.New(f, countlimit.WithObserver(m.Observer()),
			countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1 << 30, OnChange: m.BreakerChanged}))
		ctx := context.Background()
		rules := []countlimit.Rule{
			{UseType: "login", Limit: 1, Window: countlimit.Fixed(time.Minute)},
			{UseType: "sms", Limit: 2, Window: countlimit.Sliding(time.Minute)},
		}
		for i := range ids {
			id := fmt.Sprintf("id-%d", i)
			f.down.Store(i%10 == 9)
			for _, r := range rules {
				_, _ = l.Allow(ctx, r, id)
				_, _ = l.Allow(ctx, r, id)
				_, _ = l.Peek(ctx, r, id)
			}
			_, _ = l.AllowAll(ctx, id, rules...)
			_ = l.Reset(ctx, rules[0], id)
		}
		got := gather(t, m)
		return len(got), got
	}
	few, _ := series(10)
	many, got := series(10_000)
	if few != many {
		t.Errorf("10 ids made %d series, 10000 made %d", few, many)
	}
	for name := range got {
		if strings.Contains(name, "id-") {
			t.Errorf("series %s holds an id", name)
		}
	}
	if got["countlimit_store_failures_total"] == 0 || got["countlimit_decisions_total{rule=sms,verdict=denied}"] == 0 {
		t.Errorf("the traffic made no failure or denial: %v", got)
	}
}

// TestManyGoroutines: 64 goroutines on one Metrics count every decision
// and store call, under -race.
func TestManyGoroutines(t *testing.T) {
	t.Parallel()
	mem := memstore.New(memstore.WithJanitorInterval(0))
	defer mem.Close()
	m := promlimit.New()
	l := countlimit.New(mem, countlimit.WithObserver(m.Observer()))
	const goroutines, each, limit = 64, 40, 100
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			// A use type per goroutine, beside a shared one: the rule
			// counters are made while others count.
			own := countlimit.Rule{UseType: countlimit.UseType(fmt.Sprintf("own-%d", g)), Limit: limit, Window: countlimit.Fixed(time.Hour)}
			shared := countlimit.Rule{UseType: "shared", Limit: limit, Window: countlimit.Fixed(time.Hour)}
			for range each {
				if _, err := l.Allow(context.Background(), shared, "same"); err != nil {
					t.Error(err)
				}
				if _, err := l.Allow(context.Background(), own, "same"); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	got := gather(t, m)
	want := map[string]float64{
		"countlimit_decisions_total{rule=shared,verdict=allowed}": limit,
		"countlimit_decisions_total{rule=shared,verdict=denied}":  goroutines*each - limit,
		"countlimit_store_duration_seconds{op=allow}":             2 * goroutines * each,
	}
	for g := range goroutines {
		want[fmt.Sprintf("countlimit_decisions_total{rule=own-%d,verdict=allowed}", g)] = each
	}
	checkSeries(t, "after the goroutines", got, want)
}

// TestDecidedUnderNamesOfItsOwn: the observer's Decided counts under
// whatever name it is told as the use type, as the service does for a
// group of rules.
func TestDecidedUnderNamesOfItsOwn(t *testing.T) {
	m := promlimit.New()
	m.Decided("conversation.create", true)
	m.Decided("conversation.create", false)
	m.Decided("conversation.create", false)
	checkSeries(t, "Decided", gather(t, m), map[string]float64{
		"countlimit_decisions_total{rule=conversation.create,verdict=allowed}": 1,
		"countlimit_decisions_total{rule=conversation.create,verdict=denied}":  2,
	})
}

// TestBuckets: Buckets sets the histogram's bounds.
func TestBuckets(t *testing.T) {
	m := promlimit.New(promlimit.Buckets(0.5, 1))
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "countlimit_store_duration_seconds" {
			var bounds []float64
			for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
			if fmt.Sprint(bounds) != "[0.5 1]" {
				t.Errorf("buckets %v, want [0.5 1]", bounds)
			}
			return
		}
	}
	t.Error("no countlimit_store_duration_seconds")
}
