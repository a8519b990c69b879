// Package storetest is the conformance suite every driver.Store must
// pass. A store's tests call Run with a function that returns the store
// under test:
//
//	func TestConformance(t *testing.T) {
//		s := memstore.New()
//		t.Cleanup(func() { s.Close() })
//		storetest.Run(t, func(*testing.T) driver.Store { return s })
//	}
//
// Every Store that newStore returns must share its state with the others: a
// second client on the same server, or the same in-process store. Tests run
// in parallel; each uses its own UseTypes, so the store may hold other data.
// The suite drives a stubbed clock through fixed instants, so the stores are
// checked against exact ResetAt and RetryAfter values.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// Run runs the whole suite against the stores newStore returns.
func Run(t *testing.T, newStore func(t *testing.T) driver.Store) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(*testing.T, func(*testing.T) driver.Store)
	}{
		{"RollingThreePerTenSeconds", testRollingThreePerTenSeconds},
		{"RollingStartsAtFirstCountedEvent", testRollingStartsAtFirstCountedEvent},
		{"CheckLimit", testCheckLimit},
		{"CheckLimitNaturalDay", testCheckLimitNaturalDay},
		{"CalendarAndFixedBounds", testCalendarAndFixedBounds},
		{"FixedVersusSlidingAtABoundary", testFixedVersusSlidingAtABoundary},
		{"Sliding", testSliding},
		{"AllowNWeighted", testAllowNWeighted},
		{"AllowNSliding", testAllowNSliding},
		{"PeekCountsNothing", testPeekCountsNothing},
		{"Refund", testRefund},
		{"RefundSliding", testRefundSliding},
		{"Reset", testReset},
		{"PenaltyOutlivesWindow", testPenaltyOutlivesWindow},
		{"LimitChangedMidWindow", testLimitChangedMidWindow},
		{"LimitZero", testLimitZero},
		{"Lifetime", testLifetime},
		{"AllowAllHourAndDay", testAllowAllHourAndDay},
		{"AllowAllBlock", testAllowAllBlock},
		{"KeysAreIsolated", testKeysAreIsolated},
		{"LongestID", testLongestID},
		{"ConcurrentExactlyLimit", testConcurrentExactlyLimit},
		{"ConcurrentSliding", testConcurrentSliding},
		{"ConcurrentAllowAllNoDeadlock", testConcurrentAllowAll},
		{"AllowAllOfEverySize", testAllowAllOfEverySize},
		{"ConcurrentAllowAllMany", testConcurrentAllowAllMany},
		{"LateClockReadJoinsWindow", testLateClockRead},
		{"SlidingOutOfOrder", testSlidingOutOfOrder},
		{"HugeNumbers", testHugeNumbers},
		{"ConcurrentRealClock", testConcurrentRealClock},
	}
	tests = append(tests, leaseTests...)
	tests = append(tests, smoothTests...)

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore)
		})
	}
}

// Clock is a stubbed clock, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock stopped at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set stops the clock at t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// UseType returns a UseType unique to this test run, so parallel tests and
// earlier runs against the same database never share a counter.
func UseType(t testing.TB, name string) countlimit.UseType {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return countlimit.UseType("storetest." + name + "." + hex.EncodeToString(b[:]))
}

// t0 is a Monday, 09:00 UTC.
var t0 = time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v (install tzdata or import time/tzdata)", name, err)
	}
	return loc
}

type opKind int

const (
	allow opKind = iota
	peek
	refund
	reset
)

func (o opKind) String() string {
	return [...]string{"Allow", "Peek", "Refund", "Reset"}[o]
}

// step is one call at one instant and the Result it must return.
type step struct {
	at   time.Time
	op   opKind
	n    int64            // 0 means 1
	rule *countlimit.Rule // nil means the scenario's rule
	want countlimit.Result
}

// env is one scenario: a Limiter with a stubbed clock over a fresh store.
type env struct {
	t     *testing.T
	clock *Clock
	l     *countlimit.Limiter
	ctx   context.Context
}

func newEnv(t *testing.T, newStore func(*testing.T) driver.Store) *env {
	t.Helper()
	clock := NewClock(t0)
	return &env{t: t, clock: clock, l: countlimit.New(newStore(t), countlimit.WithClock(clock.Now)), ctx: context.Background()}
}

func (e *env) run(rule countlimit.Rule, id string, steps []step) {
	e.t.Helper()
	for i, s := range steps {
		e.clock.Set(s.at)
		r := rule
		if s.rule != nil {
			r = *s.rule
		}
		n := s.n
		if n == 0 {
			n = 1
		}
		var got countlimit.Result
		var err error
		switch s.op {
		case allow:
			got, err = e.l.AllowN(e.ctx, r, id, n)
		case peek:
			got, err = e.l.Peek(e.ctx, r, id)
		case refund:
			got, err = e.l.Refund(e.ctx, r, id, n)
		case reset:
			err = e.l.Reset(e.ctx, r, id)
			if err != nil {
				e.t.Fatalf("step %d: Reset at %s: %v", i, s.at.Format(time.RFC3339Nano), err)
			}
			continue
		}
		if err != nil {
			e.t.Fatalf("step %d: %s(n=%d) at %s: %v", i, s.op, n, s.at.Format(time.RFC3339Nano), err)
		}
		if d := diff(got, s.want); d != "" {
			e.t.Errorf("step %d: %s(n=%d, limit=%d) at %s:\n%s", i, s.op, n, r.Limit, s.at.Format(time.RFC3339Nano), d)
		}
	}
}

func (e *env) allowAll(id string, rules ...countlimit.Rule) []countlimit.Result {
	e.t.Helper()
	res, err := e.l.AllowAll(e.ctx, id, rules...)
	if err != nil {
		e.t.Fatalf("AllowAll at %s: %v", e.clock.Now().Format(time.RFC3339), err)
	}
	if len(res) != len(rules) {
		e.t.Fatalf("AllowAll returned %d results for %d rules", len(res), len(rules))
	}
	return res
}

// diff describes how got differs from want, or returns "".
func diff(got, want countlimit.Result) string {
	var b strings.Builder
	f := func(name string, g, w any) { fmt.Fprintf(&b, "\t%s = %v, want %v\n", name, g, w) }
	if got.Allowed != want.Allowed {
		f("Allowed", got.Allowed, want.Allowed)
	}
	if got.Limit != want.Limit {
		f("Limit", got.Limit, want.Limit)
	}
	if got.Used != want.Used {
		f("Used", got.Used, want.Used)
	}
	if got.Remaining != want.Remaining {
		f("Remaining", got.Remaining, want.Remaining)
	}
	if !got.ResetAt.Equal(want.ResetAt) {
		f("ResetAt", fmtTime(got.ResetAt), fmtTime(want.ResetAt))
	}
	if got.RetryAfter != want.RetryAfter {
		f("RetryAfter", got.RetryAfter, want.RetryAfter)
	}
	if !got.BlockedUntil.Equal(want.BlockedUntil) {
		f("BlockedUntil", fmtTime(got.BlockedUntil), fmtTime(want.BlockedUntil))
	}
	return b.String()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "zero"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ok and no build expected Results.
func ok(limit, used int64, reset time.Time) countlimit.Result {
	return countlimit.Result{Allowed: true, Limit: limit, Used: used, Remaining: max(0, limit-used), ResetAt: reset}
}

func no(limit, used int64, reset time.Time, retry time.Duration) countlimit.Result {
	return countlimit.Result{Limit: limit, Used: used, Remaining: max(0, limit-used), ResetAt: reset, RetryAfter: retry}
}

func blocked(r countlimit.Result, until time.Time) countlimit.Result {
	r.BlockedUntil = until
	return r
}

func sec(n int) time.Duration { return time.Duration(n) * time.Second }

// at returns t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// testRollingThreePerTenSeconds: 3 per 10 s rolling, one try a
// second for 25 s. Windows begin at the first counted event: 0, 10, 20.
func testRollingThreePerTenSeconds(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "rolling3per10s"), Limit: 3, Window: countlimit.Rolling(10 * time.Second)}
	var steps []step
	for s := 0; s < 25; s++ {
		begin := s / 10 * 10
		end := at(sec(begin + 10))
		if pos := s - begin; pos < 3 {
			steps = append(steps, step{at: at(sec(s)), want: ok(3, int64(pos+1), end)})
		} else {
			steps = append(steps, step{at: at(sec(s)), want: no(3, 3, end, sec(begin+10-s))})
		}
	}
	e.run(rule, "18500000000", steps)
}

func testRollingStartsAtFirstCountedEvent(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "rolling"), Limit: 2, Window: countlimit.Rolling(10 * time.Second)}
	e.run(rule, "u1", []step{
		// A denial (n > Limit) opens no window.
		{at: at(0), n: 3, want: no(2, 0, at(sec(10)), -1)},
		{at: at(sec(5)), want: ok(2, 1, at(sec(15)))},
		{at: at(sec(14)), want: ok(2, 2, at(sec(15)))},
		{at: at(sec(15)), want: ok(2, 1, at(sec(25)))},
	})
}

func testCheckLimit(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	ut := UseType(t, "checklimit")
	want := []struct {
		at   time.Duration
		want bool
	}{
		{0, true}, {sec(1), true}, {sec(2), false}, {sec(59), false},
		// [t0, t0+60s) is over: the window restarts at now with count 1.
		{sec(60), true}, {sec(61), true}, {sec(62), false}, {sec(119), false}, {sec(120), true},
	}
	for i, w := range want {
		e.clock.Set(at(w.at))
		got, err := e.l.CheckLimit(e.ctx, ut, "18500000000", 2, time.Minute, time.Time{})
		if err != nil {
			t.Fatalf("step %d: CheckLimit at +%v: %v", i, w.at, err)
		}
		if got != w.want {
			t.Errorf("step %d: CheckLimit(limit 2, 1m, zero beginTime) at +%v = %v, want %v", i, w.at, got, w.want)
		}
	}
	// CheckLimit and Allow share the counter of one UseType and id.
	e.clock.Set(at(sec(121)))
	r, err := e.l.Peek(e.ctx, countlimit.Rule{UseType: ut, Limit: 2, Window: countlimit.Rolling(time.Minute)}, "18500000000")
	if err != nil {
		t.Fatal(err)
	}
	if d := diff(r, ok(2, 1, at(sec(180)))); d != "" {
		t.Errorf("Peek after CheckLimit:\n%s", d)
	}
	// A beginTime whose window has already ended: every call finds the
	// stored window stale and restarts it, so every call is allowed (the
	// seed's own logic; CheckLimit's doc says so).
	past := at(-time.Hour)
	for i := range 5 {
		got, err := e.l.CheckLimit(e.ctx, ut, "ended", 2, time.Minute, past)
		if err != nil || !got {
			t.Errorf("call %d: CheckLimit(limit 2, 1m, beginTime an hour ago) = %v, %v; want true", i+1, got, err)
		}
	}
}

func testCheckLimitNaturalDay(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	sh := mustLoad(t, "Asia/Shanghai")
	ut := UseType(t, "password")
	midnight := func(tm time.Time) time.Time {
		y, m, d := tm.In(sh).Date()
		return time.Date(y, m, d, 0, 0, 0, 0, sh)
	}
	day := func(d, h, min int) time.Time { return time.Date(2026, 5, d, h, min, 0, 0, sh) }
	want := []struct {
		at   time.Time
		want bool
	}{
		{day(11, 0, 0), true}, {day(11, 12, 0), true}, {day(11, 18, 0), true},
		{day(11, 23, 59), false},
		{day(12, 0, 0), true}, {day(12, 1, 0), true}, {day(12, 2, 0), true}, {day(12, 3, 0), false},
		{day(14, 9, 0), true},
	}
	for i, w := range want {
		e.clock.Set(w.at)
		got, err := e.l.CheckLimit(e.ctx, ut, "user-7", 3, 24*time.Hour, midnight(w.at))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got != w.want {
			t.Errorf("step %d: CheckLimit(3 per natural day) at %s = %v, want %v", i, w.at.Format(time.RFC3339), got, w.want)
		}
	}
}

// testCalendarAndFixedBounds checks the exact end of natural and fixed
// windows, across DST changes: each row allows one event, then is denied
// until the window ends to the microsecond.
func testCalendarAndFixedBounds(t *testing.T, newStore func(*testing.T) driver.Store) {
	sh, ny, berlin := mustLoad(t, "Asia/Shanghai"), mustLoad(t, "America/New_York"), mustLoad(t, "Europe/Berlin")
	santiago := mustLoad(t, "America/Santiago")
	// Santiago skips midnight on 2026-09-06: Sept 5 ends, and Sept 6 begins,
	// at 04:00 UTC (00:00 -04 became 01:00 -03).
	santiagoDST := time.Date(2026, 9, 6, 4, 0, 0, 0, time.UTC)
	rows := []struct {
		name      string
		window    countlimit.Window
		start     time.Time
		end       time.Time
		nextEnd   time.Time
		wantRetry time.Duration // RetryAfter one second after start
	}{
		{"day Shanghai", countlimit.Calendar(countlimit.Day, sh),
			time.Date(2026, 3, 10, 23, 30, 0, 0, sh), time.Date(2026, 3, 11, 0, 0, 0, 0, sh), time.Date(2026, 3, 12, 0, 0, 0, 0, sh), 29*time.Minute + 59*time.Second},
		{"day New York spring forward (23h)", countlimit.Calendar(countlimit.Day, ny),
			time.Date(2026, 3, 8, 0, 30, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny), time.Date(2026, 3, 10, 0, 0, 0, 0, ny), 22*time.Hour + 29*time.Minute + 59*time.Second},
		{"day New York fall back (25h)", countlimit.Calendar(countlimit.Day, ny),
			time.Date(2026, 11, 1, 0, 30, 0, 0, ny), time.Date(2026, 11, 2, 0, 0, 0, 0, ny), time.Date(2026, 11, 3, 0, 0, 0, 0, ny), 24*time.Hour + 29*time.Minute + 59*time.Second},
		{"day Santiago before a skipped midnight", countlimit.Calendar(countlimit.Day, santiago),
			time.Date(2026, 9, 5, 12, 0, 0, 0, santiago), santiagoDST, time.Date(2026, 9, 7, 0, 0, 0, 0, santiago), 12*time.Hour - time.Second},
		{"day Santiago after a skipped midnight", countlimit.Calendar(countlimit.Day, santiago),
			time.Date(2026, 9, 6, 12, 0, 0, 0, santiago), time.Date(2026, 9, 7, 0, 0, 0, 0, santiago), time.Date(2026, 9, 8, 0, 0, 0, 0, santiago), 12*time.Hour - time.Second},
		{"ISO week from Sunday", countlimit.Calendar(countlimit.Week, berlin),
			time.Date(2026, 11, 22, 12, 0, 0, 0, berlin), time.Date(2026, 11, 23, 0, 0, 0, 0, berlin), time.Date(2026, 11, 30, 0, 0, 0, 0, berlin), 11*time.Hour + 59*time.Minute + 59*time.Second},
		{"ISO week across DST", countlimit.Calendar(countlimit.Week, berlin),
			time.Date(2026, 3, 23, 0, 0, 0, 0, berlin), time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), time.Date(2026, 4, 6, 0, 0, 0, 0, berlin), 7*24*time.Hour - time.Hour - time.Second},
		{"month February", countlimit.Calendar(countlimit.Month, sh),
			time.Date(2026, 2, 15, 10, 0, 0, 0, sh), time.Date(2026, 3, 1, 0, 0, 0, 0, sh), time.Date(2026, 4, 1, 0, 0, 0, 0, sh), 13*24*time.Hour + 14*time.Hour - time.Second},
		{"year New York", countlimit.Calendar(countlimit.Year, ny),
			time.Date(2026, 7, 4, 12, 0, 0, 0, ny), time.Date(2027, 1, 1, 0, 0, 0, 0, ny), time.Date(2028, 1, 1, 0, 0, 0, 0, ny), time.Date(2027, 1, 1, 0, 0, 0, 0, ny).Sub(time.Date(2026, 7, 4, 12, 0, 1, 0, ny))},
		{"fixed hour", countlimit.Fixed(time.Hour),
			time.Date(2026, 5, 11, 10, 30, 0, 0, time.UTC), time.Date(2026, 5, 11, 11, 0, 0, 0, time.UTC), time.Date(2026, 5, 11, 12, 0, 0, 0, time.UTC), 29*time.Minute + 59*time.Second},
		{"fixed hour in a +05:30 zone is still UTC-aligned", countlimit.Fixed(time.Hour),
			time.Date(2026, 5, 11, 10, 30, 0, 0, time.FixedZone("IST", 5*3600+1800)), time.Date(2026, 5, 11, 6, 0, 0, 0, time.UTC), time.Date(2026, 5, 11, 7, 0, 0, 0, time.UTC), 59*time.Minute + 59*time.Second},
		{"fixed 7 days from the epoch (a Thursday)", countlimit.Fixed(7 * 24 * time.Hour),
			time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC), time.Date(2026, 5, 14, 0, 0, 0, 0, time.UTC), time.Date(2026, 5, 21, 0, 0, 0, 0, time.UTC), 2*24*time.Hour + 15*time.Hour - time.Second},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, newStore)
			rule := countlimit.Rule{UseType: UseType(t, "bounds"), Limit: 1, Window: row.window}
			if got := row.end.Sub(row.start.Add(time.Second)); got != row.wantRetry {
				t.Fatalf("bad row: end - (start+1s) = %v, row says %v", got, row.wantRetry)
			}
			e.run(rule, "id", []step{
				{at: row.start, want: ok(1, 1, row.end)},
				{at: row.start.Add(time.Second), want: no(1, 1, row.end, row.wantRetry)},
				{at: row.end.Add(-time.Microsecond), want: no(1, 1, row.end, time.Microsecond)},
				{at: row.end, want: ok(1, 1, row.nextEnd)},
			})
		})
	}
}

// testFixedVersusSlidingAtABoundary: 14 events inside one
// second. Fixed one-second windows admit all 14 (7 on each side of the
// boundary); the sliding log admits exactly 10.
func testFixedVersusSlidingAtABoundary(t *testing.T, newStore func(*testing.T) driver.Store) {
	times := make([]time.Time, 0, 14)
	for i := 0; i < 7; i++ {
		times = append(times, at(500*time.Millisecond+time.Duration(i)*50*time.Millisecond))
	}
	for i := 0; i < 7; i++ {
		times = append(times, at(time.Second+time.Duration(i)*50*time.Millisecond))
	}
	count := func(w countlimit.Window) (allowed []time.Time) {
		e := newEnv(t, newStore)
		rule := countlimit.Rule{UseType: UseType(t, "fixedvssliding"), Limit: 10, Window: w}
		for _, tm := range times {
			e.clock.Set(tm)
			r, err := e.l.Allow(e.ctx, rule, "session-1")
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				allowed = append(allowed, tm)
			}
		}
		return allowed
	}
	if got := count(countlimit.Fixed(time.Second)); len(got) != 14 {
		t.Errorf("Fixed(1s), limit 10: %d of 14 allowed in 0.8s, want all 14 (fixed windows' flaw at a boundary)", len(got))
	}
	got := count(countlimit.Sliding(time.Second))
	if len(got) != 10 {
		t.Errorf("Sliding(1s), limit 10: %d of 14 allowed, want 10", len(got))
	}
	for i := range got {
		n := 0
		for j := i; j < len(got) && got[j].Sub(got[i]) < time.Second; j++ {
			n++
		}
		if n > 10 {
			t.Errorf("Sliding(1s): %d events allowed in the second from %s", n, got[i].Format(time.RFC3339Nano))
		}
	}
}

func testSliding(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "sliding"), Limit: 2, Window: countlimit.Sliding(10 * time.Second)}
	e.run(rule, "+8613800000000", []step{
		{at: at(0), op: peek, want: ok(2, 0, at(0))},
		{at: at(0), want: ok(2, 1, at(sec(10)))},
		{at: at(sec(3)), want: ok(2, 2, at(sec(10)))},
		{at: at(sec(5)), want: no(2, 2, at(sec(10)), sec(5))},
		{at: at(sec(10) - time.Microsecond), want: no(2, 2, at(sec(10)), time.Microsecond)},
		// The event at 0 leaves the log at exactly 10s.
		{at: at(sec(10)), want: ok(2, 2, at(sec(13)))},
		{at: at(sec(12)), want: no(2, 2, at(sec(13)), sec(1))},
		{at: at(sec(30)), op: peek, want: ok(2, 0, at(sec(30)))},
		// Two events at one instant are two events (a log keyed by time alone loses one).
		{at: at(sec(40)), want: ok(2, 1, at(sec(50)))},
		{at: at(sec(40)), want: ok(2, 2, at(sec(50)))},
		{at: at(sec(40)), want: no(2, 2, at(sec(50)), sec(10))},
	})
}

func testAllowNWeighted(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "weighted"), Limit: 10, Window: countlimit.Fixed(time.Minute)}
	end := at(time.Minute)
	e.run(rule, "api-key-1", []step{
		{at: at(0), n: 4, want: ok(10, 4, end)},
		{at: at(sec(10)), n: 7, want: no(10, 4, end, sec(50))},
		{at: at(sec(20)), n: 6, want: ok(10, 10, end)},
		{at: at(sec(30)), n: 11, want: no(10, 10, end, -1)},
		{at: at(sec(30)), want: no(10, 10, end, sec(30))},
		{at: at(sec(60)), n: 10, want: ok(10, 10, at(2*time.Minute))},
	})
}

func testAllowNSliding(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "weightedsliding"), Limit: 5, Window: countlimit.Sliding(time.Minute)}
	e.run(rule, "api-key-2", []step{
		{at: at(0), n: 3, want: ok(5, 3, at(sec(60)))},
		{at: at(sec(10)), n: 2, want: ok(5, 5, at(sec(60)))},
		// Room for 3 comes when the three events at 0 leave; for 4, when
		// one of those at 10s leaves too.
		{at: at(sec(20)), n: 3, want: no(5, 5, at(sec(60)), sec(40))},
		{at: at(sec(20)), n: 4, want: no(5, 5, at(sec(60)), sec(50))},
		{at: at(sec(20)), n: 6, want: no(5, 5, at(sec(60)), -1)},
		{at: at(sec(60)), n: 3, want: ok(5, 5, at(sec(70)))},
	})
}

func testPeekCountsNothing(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "peek"), Limit: 2, Window: countlimit.Fixed(time.Minute)}
	end := at(time.Minute)
	e.run(rule, "u", []step{
		{at: at(0), op: peek, want: ok(2, 0, end)},
		{at: at(sec(1)), op: peek, want: ok(2, 0, end)},
		{at: at(sec(2)), want: ok(2, 1, end)},
		{at: at(sec(3)), op: peek, want: ok(2, 1, end)},
		{at: at(sec(4)), op: peek, want: ok(2, 1, end)},
		{at: at(sec(5)), want: ok(2, 2, end)},
		{at: at(sec(6)), op: peek, want: no(2, 2, end, sec(54))},
		{at: at(sec(7)), op: peek, want: no(2, 2, end, sec(53))},
		{at: at(sec(60)), op: peek, want: ok(2, 0, at(2*time.Minute))},
	})
}

func testRefund(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "refund"), Limit: 3, Window: countlimit.Fixed(time.Minute)}
	end := at(time.Minute)
	e.run(rule, "phone", []step{
		{at: at(0), op: refund, n: 1, want: ok(3, 0, end)},
		{at: at(sec(1)), want: ok(3, 1, end)},
		{at: at(sec(2)), want: ok(3, 2, end)},
		{at: at(sec(3)), want: ok(3, 3, end)},
		{at: at(sec(4)), want: no(3, 3, end, sec(56))},
		{at: at(sec(5)), op: refund, n: 1, want: ok(3, 2, end)},
		{at: at(sec(6)), want: ok(3, 3, end)},
		{at: at(sec(7)), op: refund, n: 5, want: ok(3, 0, end)},
		{at: at(sec(8)), want: ok(3, 1, end)},
		// A refund never reaches into a past window.
		{at: at(sec(61)), op: refund, n: 1, want: ok(3, 0, at(2*time.Minute))},
	})
}

func testRefundSliding(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "refundsliding"), Limit: 2, Window: countlimit.Sliding(time.Minute)}
	e.run(rule, "phone", []step{
		{at: at(0), want: ok(2, 1, at(sec(60)))},
		{at: at(sec(10)), want: ok(2, 2, at(sec(60)))},
		// The newest event goes back; the oldest still ends the wait.
		{at: at(sec(20)), op: refund, n: 1, want: ok(2, 1, at(sec(60)))},
		{at: at(sec(30)), want: ok(2, 2, at(sec(60)))},
		{at: at(sec(40)), want: no(2, 2, at(sec(60)), sec(20))},
		{at: at(sec(41)), op: refund, n: 9, want: ok(2, 0, at(sec(41)))},
	})
}

func testReset(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "reset"), Limit: 1, Window: countlimit.Calendar(countlimit.Day, time.UTC), Block: time.Hour}
	end := time.Date(2026, 5, 12, 0, 0, 0, 0, time.UTC)
	e.run(rule, "user-1", []step{
		{at: at(0), op: reset},
		{at: at(0), want: ok(1, 1, end)},
		{at: at(sec(1)), want: blocked(no(1, 1, end, 15*time.Hour-time.Second), at(time.Hour+time.Second))},
		{at: at(sec(2)), op: reset},
		{at: at(sec(2)), op: peek, want: ok(1, 0, end)},
		{at: at(sec(3)), want: ok(1, 1, end)},
	})
	// Reset touches only its own UseType and id.
	other := countlimit.Rule{UseType: UseType(t, "reset-other"), Limit: 1, Window: rule.Window}
	e.run(other, "user-1", []step{{at: at(sec(4)), want: ok(1, 1, end)}})
	e.run(rule, "user-2", []step{{at: at(sec(4)), want: ok(1, 1, end)}})
	e.run(rule, "user-1", []step{{at: at(sec(5)), op: reset}})
	e.run(other, "user-1", []step{{at: at(sec(6)), op: peek, want: no(1, 1, end, 15*time.Hour-sec(6))}})
	e.run(rule, "user-2", []step{{at: at(sec(6)), op: peek, want: no(1, 1, end, 15*time.Hour-sec(6))}})
}

// testPenaltyOutlivesWindow is the penalty box: 2 per minute, then 5
// minutes out, even though the minute window resets meanwhile.
func testPenaltyOutlivesWindow(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "penalty"), Limit: 2, Window: countlimit.Fixed(time.Minute), Block: 5 * time.Minute}
	m1, m2, m6 := at(time.Minute), at(2*time.Minute), at(6*time.Minute)
	until := at(5*time.Minute + 20*time.Second)
	e.run(rule, "10.0.0.1", []step{
		{at: at(0), want: ok(2, 1, m1)},
		{at: at(sec(10)), want: ok(2, 2, m1)},
		{at: at(sec(20)), want: blocked(no(2, 2, m1, 5*time.Minute), until)},
		{at: at(sec(30)), op: peek, want: blocked(no(2, 2, m1, 4*time.Minute+50*time.Second), until)},
		{at: at(time.Minute), want: blocked(no(2, 0, m2, 4*time.Minute+20*time.Second), until)},
		// Denials inside the penalty do not extend it.
		{at: at(3 * time.Minute), want: blocked(no(2, 0, at(4*time.Minute), 2*time.Minute+20*time.Second), until)},
		{at: until.Add(-time.Second), want: blocked(no(2, 0, m6, time.Second), until)},
		{at: until, want: ok(2, 1, m6)},
	})
	// A penalty shorter than the rest of the window: the wait is the later of the two.
	short := countlimit.Rule{UseType: UseType(t, "penaltyshort"), Limit: 1, Window: countlimit.Fixed(time.Hour), Block: time.Minute}
	h := at(time.Hour)
	e.run(short, "10.0.0.2", []step{
		{at: at(0), want: ok(1, 1, h)},
		{at: at(sec(10)), want: blocked(no(1, 1, h, time.Hour-sec(10)), at(sec(70)))},
		// The penalty is over; the next denial starts a new one.
		{at: at(sec(80)), want: blocked(no(1, 1, h, time.Hour-sec(80)), at(sec(140)))},
	})
}

func testLimitChangedMidWindow(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "limitchange"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	lower, higher := rule, rule
	lower.Limit, higher.Limit = 2, 10
	end := at(time.Hour)
	e.run(rule, "member-9", []step{
		{at: at(0), want: ok(5, 1, end)},
		{at: at(0), want: ok(5, 2, end)},
		{at: at(0), want: ok(5, 3, end)},
		{at: at(sec(1)), rule: &lower, want: no(2, 3, end, time.Hour-sec(1))},
		{at: at(sec(1)), rule: &lower, op: peek, want: no(2, 3, end, time.Hour-sec(1))},
		{at: at(sec(2)), rule: &higher, want: ok(10, 4, end)},
		{at: at(sec(3)), want: ok(5, 5, end)},
		{at: at(sec(4)), want: no(5, 5, end, time.Hour-sec(4))},
	})
}

func testLimitZero(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "zero"), Limit: 0, Window: countlimit.Fixed(time.Hour)}
	e.run(rule, "anyone", []step{
		{at: at(0), want: no(0, 0, at(time.Hour), -1)},
		{at: at(0), op: peek, want: no(0, 0, at(time.Hour), -1)},
	})
	got, err := e.l.CheckLimit(e.ctx, rule.UseType, "anyone", 0, time.Hour, time.Time{})
	if err != nil || got {
		t.Errorf("CheckLimit with limit 0 = %v, %v; want false, nil", got, err)
	}
}

func testLifetime(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "lifetime"), Limit: 2, Window: countlimit.Lifetime()}
	var never time.Time
	e.run(rule, "trial-user", []step{
		{at: at(0), want: ok(2, 1, never)},
		{at: at(time.Hour), want: ok(2, 2, never)},
		{at: at(2 * time.Hour), want: no(2, 2, never, -1)},
		{at: t0.AddDate(100, 0, 0), want: no(2, 2, never, -1)},
		{at: t0.AddDate(100, 0, 0), op: refund, n: 1, want: ok(2, 1, never)},
		{at: t0.AddDate(100, 0, 1), want: ok(2, 2, never)},
		{at: t0.AddDate(100, 0, 1), op: reset},
		{at: t0.AddDate(100, 0, 1), op: peek, want: ok(2, 0, never)},
	})
}

// testAllowAllHourAndDay is "10 per hour AND 15 per day": when one
// rule denies, the other counts nothing.
func testAllowAllHourAndDay(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	hour := countlimit.Rule{UseType: UseType(t, "conv.hour"), Limit: 10, Window: countlimit.Fixed(time.Hour)}
	day := countlimit.Rule{UseType: UseType(t, "conv.day"), Limit: 15, Window: countlimit.Calendar(countlimit.Day, time.UTC)}
	id := "user-42"
	midnight := time.Date(2026, 5, 12, 0, 0, 0, 0, time.UTC)
	check := func(step string, got []countlimit.Result, want ...countlimit.Result) {
		t.Helper()
		for i := range want {
			if d := diff(got[i], want[i]); d != "" {
				t.Errorf("%s: result %d:\n%s", step, i, d)
			}
		}
	}
	for i := 0; i < 10; i++ {
		e.clock.Set(at(sec(i)))
		check(fmt.Sprintf("event %d", i), e.allowAll(id, hour, day), ok(10, int64(i+1), at(time.Hour)), ok(15, int64(i+1), midnight))
	}
	e.clock.Set(at(sec(30)))
	retry := time.Hour - sec(30)
	check("11th in the hour", e.allowAll(id, hour, day), no(10, 10, at(time.Hour), retry), no(15, 10, midnight, retry))
	for i := 0; i < 5; i++ {
		e.clock.Set(at(time.Hour + sec(i)))
		check(fmt.Sprintf("hour 2 event %d", i), e.allowAll(id, day, hour), ok(15, int64(11+i), midnight), ok(10, int64(i+1), at(2*time.Hour)))
	}
	e.clock.Set(at(time.Hour + sec(10)))
	retry = midnight.Sub(at(time.Hour + sec(10)))
	check("16th in the day", e.allowAll(id, hour, day), no(10, 5, at(2*time.Hour), retry), no(15, 15, midnight, retry))
	// Nothing was counted by the denied calls.
	hr, err := e.l.Peek(e.ctx, hour, id)
	if err != nil {
		t.Fatal(err)
	}
	if d := diff(hr, ok(10, 5, at(2*time.Hour))); d != "" {
		t.Errorf("hourly counter after denied AllowAll:\n%s", d)
	}
	e.clock.Set(midnight)
	check("next day", e.allowAll(id, hour, day), ok(10, 1, midnight.Add(time.Hour)), ok(15, 1, midnight.AddDate(0, 0, 1)))
}

// testAllowAllBlock: only the rule that denies sets its penalty.
func testAllowAllBlock(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	strict := countlimit.Rule{UseType: UseType(t, "all.strict"), Limit: 1, Window: countlimit.Fixed(time.Minute), Block: 10 * time.Minute}
	loose := countlimit.Rule{UseType: UseType(t, "all.loose"), Limit: 100, Window: countlimit.Fixed(time.Minute), Block: 10 * time.Minute}
	e.allowAll("ip", loose, strict)
	e.clock.Set(at(sec(1)))
	res := e.allowAll("ip", loose, strict)
	until := at(10*time.Minute + sec(1))
	if d := diff(res[1], blocked(no(1, 1, at(time.Minute), 10*time.Minute), until)); d != "" {
		t.Errorf("denying rule:\n%s", d)
	}
	if d := diff(res[0], no(100, 1, at(time.Minute), 10*time.Minute)); d != "" {
		t.Errorf("rule that had room:\n%s", d)
	}
	e.run(loose, "ip", []step{{at: at(sec(2)), want: ok(100, 2, at(time.Minute))}})
	e.run(strict, "ip", []step{{at: at(2 * time.Minute), want: blocked(no(1, 0, at(3*time.Minute), 8*time.Minute+sec(1)), until)}})
}

func testKeysAreIsolated(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	a := countlimit.Rule{UseType: UseType(t, "iso"), Limit: 1, Window: countlimit.Fixed(time.Hour)}
	b := a
	b.UseType += ".b"
	end := at(time.Hour)
	long := strings.Repeat("界", expose.MaxIDLen/3) // 510 bytes
	for _, id := range []string{"u1", "u2", "用户:42", "a:b{c}", "a", "a:", long} {
		e.run(a, id, []step{{at: at(0), want: ok(1, 1, end)}})
	}
	e.run(b, "u1", []step{{at: at(0), want: ok(1, 1, end)}})
	e.run(a, "u1", []step{{at: at(0), want: no(1, 1, end, time.Hour)}})
}

// testLongestID: an id of 512 bytes, the longest there is, counts.
func testLongestID(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	good := countlimit.Rule{UseType: UseType(t, "longest"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	e.run(good, strings.Repeat("x", expose.MaxIDLen), []step{{at: at(0), want: ok(5, 1, at(time.Hour))}})
}

// testConcurrentExactlyLimit: 64 goroutines × 8 tries on one key with limit
// 100, through two Limiters on two stores sharing state: exactly 100 pass.
func testConcurrentExactlyLimit(t *testing.T, newStore func(*testing.T) driver.Store) {
	clock := NewClock(t0)
	ls := []*countlimit.Limiter{
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
	}
	rule := countlimit.Rule{UseType: UseType(t, "concurrent"), Limit: 100, Window: countlimit.Fixed(time.Hour)}
	allowed := hammer(t, 64, 8, func(g int) (bool, error) {
		r, err := ls[g%2].Allow(context.Background(), rule, "hot-key")
		return r.Allowed, err
	})
	if allowed != 100 {
		t.Errorf("%d allowed, want exactly 100", allowed)
	}
	r, err := ls[0].Peek(context.Background(), rule, "hot-key")
	if err != nil {
		t.Fatal(err)
	}
	if r.Used != 100 {
		t.Errorf("Used after the storm = %d, want 100", r.Used)
	}
}

func testConcurrentSliding(t *testing.T, newStore func(*testing.T) driver.Store) {
	clock := NewClock(t0)
	ls := []*countlimit.Limiter{
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
	}
	rule := countlimit.Rule{UseType: UseType(t, "concurrentsliding"), Limit: 50, Window: countlimit.Sliding(time.Minute)}
	var weight atomic.Int64
	hammer(t, 32, 4, func(g int) (bool, error) {
		n := int64(1 + g%2)
		r, err := ls[g%2].AllowN(context.Background(), rule, "hot-key", n)
		if r.Allowed {
			weight.Add(n)
		}
		return r.Allowed, err
	})
	r, err := ls[0].Peek(context.Background(), rule, "hot-key")
	if err != nil {
		t.Fatal(err)
	}
	// 96 calls of weight 1 or 2 compete for 50: the log ends full, or one
	// short when only weight-2 calls were left.
	if r.Used != weight.Load() || r.Used > 50 || r.Used < 49 {
		t.Errorf("Used after the storm = %d, allowed weight %d; want them equal and 49 or 50", r.Used, weight.Load())
	}
}

// testConcurrentAllowAll runs multi-rule checks naming the rules in both
// orders: none may deadlock, and the tighter rule caps both counters.
func testConcurrentAllowAll(t *testing.T, newStore func(*testing.T) driver.Store) {
	clock := NewClock(t0)
	ls := []*countlimit.Limiter{
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
	}
	a := countlimit.Rule{UseType: UseType(t, "cc.a"), Limit: 50, Window: countlimit.Fixed(time.Hour)}
	b := countlimit.Rule{UseType: UseType(t, "cc.b"), Limit: 1000, Window: countlimit.Calendar(countlimit.Day, time.UTC)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	allowed := hammer(t, 32, 8, func(g int) (bool, error) {
		rules := []countlimit.Rule{a, b}
		if g%2 == 1 {
			rules = []countlimit.Rule{b, a}
		}
		res, err := ls[g%2].AllowAll(ctx, "pair", rules...)
		if err != nil {
			return false, err
		}
		return res[0].Allowed, nil
	})
	if allowed != 50 {
		t.Errorf("%d allowed, want exactly 50", allowed)
	}
	for _, r := range []countlimit.Rule{a, b} {
		got, err := ls[0].Peek(ctx, r, "pair")
		if err != nil {
			t.Fatal(err)
		}
		if got.Used != 50 {
			t.Errorf("%s Used = %d, want 50", r.UseType, got.Used)
		}
	}
}

// hammer runs g goroutines making tries calls each, all released at once,
// and returns how many calls were allowed.
func hammer(t *testing.T, g, tries int, call func(g int) (bool, error)) int {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed int
		errs    []error
	)
	start := make(chan struct{})
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := 0; j < tries; j++ {
				ok, err := call(i)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else if ok {
					allowed++
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs[:min(len(errs), 3)] {
		t.Errorf("concurrent call: %v", err)
	}
	return allowed
}

// testLateClockRead: a caller whose clock read is older than a window
// another caller has just opened (it read the clock, then waited for the
// store) joins that window instead of resetting it.
func testLateClockRead(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rolling := countlimit.Rule{UseType: UseType(t, "late.rolling"), Limit: 1, Window: countlimit.Rolling(time.Hour)}
	e.run(rolling, "id", []step{
		{at: at(5 * time.Millisecond), want: ok(1, 1, at(time.Hour+5*time.Millisecond))},
		{at: at(0), want: no(1, 1, at(time.Hour+5*time.Millisecond), time.Hour+5*time.Millisecond)},
	})
	fixed := countlimit.Rule{UseType: UseType(t, "late.fixed"), Limit: 1, Window: countlimit.Fixed(time.Hour)}
	e.run(fixed, "id", []step{
		{at: at(time.Hour), want: ok(1, 1, at(2*time.Hour))},
		// Read just before the boundary, arriving after the new window opened.
		{at: at(time.Hour - time.Millisecond), want: no(1, 1, at(2*time.Hour), time.Hour+time.Millisecond)},
	})
	ut := UseType(t, "late.checklimit")
	for i, w := range []struct {
		at   time.Duration
		want bool
	}{{5 * time.Millisecond, true}, {0, false}} {
		e.clock.Set(at(w.at))
		got, err := e.l.CheckLimit(e.ctx, ut, "id", 1, time.Minute, time.Time{})
		if err != nil || got != w.want {
			t.Errorf("step %d: CheckLimit(limit 1) at +%v = %v, %v; want %v", i, w.at, got, err, w.want)
		}
	}
}

// testSlidingOutOfOrder: events logged by late clock reads keep the log in
// time order, so they leave it, and are refunded, by time.
func testSlidingOutOfOrder(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "ooo"), Limit: 2, Window: countlimit.Sliding(10 * time.Second)}
	ms := time.Millisecond
	e.run(rule, "a", []step{
		{at: at(5 * ms), want: ok(2, 1, at(10*time.Second+5*ms))},
		{at: at(1 * ms), want: ok(2, 2, at(10*time.Second+1*ms))},
		// The event at 1ms has left; the one at 5ms has not.
		{at: at(10*time.Second + 2*ms), op: peek, want: ok(2, 1, at(10*time.Second+5*ms))},
	})
	e.run(rule, "b", []step{
		{at: at(5 * ms), want: ok(2, 1, at(10*time.Second+5*ms))},
		{at: at(1 * ms), want: ok(2, 2, at(10*time.Second+1*ms))},
		// A refund takes back the newest event, 5ms.
		{at: at(2 * ms), op: refund, n: 1, want: ok(2, 1, at(10*time.Second+1*ms))},
		{at: at(10*time.Second + 2*ms), op: peek, want: ok(2, 0, at(10*time.Second+2*ms))},
	})
}

// testHugeNumbers: limits and weights up to 2^53 and penalties of 100 years
// are exact on every store, and nothing overflows.
func testHugeNumbers(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	end := at(time.Hour)
	rule := countlimit.Rule{UseType: UseType(t, "huge"), Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour), Block: expose.MaxDuration}
	e.run(rule, "id", []step{
		{at: at(0), n: expose.MaxLimit - 1, want: ok(expose.MaxLimit, expose.MaxLimit-1, end)},
		{at: at(0), want: ok(expose.MaxLimit, expose.MaxLimit, end)},
		{at: at(sec(1)), n: expose.MaxLimit, want: blocked(no(expose.MaxLimit, expose.MaxLimit, end, expose.MaxDuration), at(sec(1)+expose.MaxDuration))},
	})
}

// testConcurrentRealClock: with the real clock, callers' clock reads and
// their turns at the store come in different orders; still exactly Limit
// pass per key.
func testConcurrentRealClock(t *testing.T, newStore func(*testing.T) driver.Store) {
	ls := []*countlimit.Limiter{countlimit.New(newStore(t)), countlimit.New(newStore(t))}
	for _, w := range []countlimit.Window{countlimit.Rolling(time.Hour), countlimit.Sliding(time.Hour)} {
		rule := countlimit.Rule{UseType: UseType(t, "realclock"), Limit: 1, Window: w}
		const keys = 40
		var mu sync.Mutex
		perKey := map[int]int{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for k := range keys {
					r, err := ls[g%2].Allow(context.Background(), rule, fmt.Sprint("key-", k))
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						mu.Lock()
						perKey[k]++
						mu.Unlock()
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		for k := range keys {
			if perKey[k] != 1 {
				t.Errorf("%v: key-%d allowed %d times, want 1", w, k, perKey[k])
			}
		}
	}
}
