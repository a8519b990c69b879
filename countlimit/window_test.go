package countlimit

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"
)

// fuzzZones are the zones FuzzBounds draws from: DST in both hemispheres,
// half-hour and 45-minute offsets, a skipped midnight (Santiago), a
// midnight that happens twice (Amman) and a skipped day (Apia). New zones
// go at the end, so the corpus's zone numbers keep their zones.
var fuzzZones = []string{"UTC", "Asia/Shanghai", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "America/Santiago", "Asia/Kathmandu", "Pacific/Chatham", "Asia/Amman", "Pacific/Apia"}

func fuzzWindow(t *testing.T, kind, zone uint8, d int64) Window {
	switch kind % 6 {
	case 5:
		return Concurrent(time.Duration(d))
	case 0:
		return Rolling(time.Duration(d))
	case 1:
		return Fixed(time.Duration(d))
	case 2:
		return Sliding(time.Duration(d))
	case 3:
		return Lifetime()
	}
	loc, err := time.LoadLocation(fuzzZones[int(zone)%len(fuzzZones)])
	if err != nil {
		t.Fatal(err) // time/tzdata is imported: every machine has every zone
	}
	return Calendar(Unit(1+int(d&3)), loc)
}

// FuzzBounds checks that every window with bounds contains now (Sliding and
// Concurrent windows have none), and that Fixed and Calendar windows tile time: no gaps, no overlaps, stable from any instant
// inside them.
func FuzzBounds(f *testing.F) {
	f.Add(time.Date(2026, 3, 8, 2, 30, 0, 0, time.UTC).UnixMicro(), uint8(4), uint8(2), int64(0))
	f.Add(time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC).UnixMicro(), uint8(4), uint8(2), int64(0))
	f.Add(time.Date(2026, 4, 5, 1, 59, 59, 0, time.UTC).UnixMicro(), uint8(4), uint8(4), int64(1))
	// Santiago skips its midnight on 2026-09-06: the day begins at 01:00.
	f.Add(time.Date(2026, 9, 6, 4, 30, 0, 0, time.UTC).UnixMicro(), uint8(4), uint8(5), int64(0))
	f.Add(time.Date(2026, 9, 6, 2, 59, 0, 0, time.UTC).UnixMicro(), uint8(4), uint8(5), int64(0))
	// Amman's midnight of 2021-10-29 happened twice: the day begins at the first.
	f.Add(time.Date(2021, 10, 28, 21, 30, 0, 0, time.UTC).UnixMicro(), uint8(4), uint8(8), int64(0))
	// Apia skipped 2011-12-30: the 29th ends when the 31st begins.
	f.Add(time.Date(2011, 12, 30, 9, 0, 0, 0, time.UTC).UnixMicro(), uint8(4), uint8(9), int64(0))
	f.Add(int64(-1), uint8(1), uint8(0), int64(7*24*time.Hour))
	f.Add(int64(0), uint8(1), uint8(0), int64(time.Hour))
	f.Add(int64(1700000000123456), uint8(0), uint8(0), int64(1500))
	// Sliding and Concurrent windows have no bounds.
	f.Add(int64(84), uint8(2), uint8(0), int64(604800000000030))
	f.Add(int64(84), uint8(5), uint8(0), int64(time.Minute))
	f.Fuzz(func(t *testing.T, us int64, kind, zone uint8, d int64) {
		// Years 1900..2200: what a counter may meet.
		const lo, hi = -2208988800 * 1e6, 7258118400 * 1e6
		if us < lo || us > hi {
			t.Skip()
		}
		w := fuzzWindow(t, kind, zone, d)
		if err := w.validate(); err != nil {
			if d >= int64(time.Microsecond) && w.kind != kindCalendar {
				t.Fatalf("%v: valid duration rejected: %v", w, err)
			}
			return
		}
		if w.kind != kindCalendar && w.kind != kindLifetime && time.Duration(d) > 100*365*24*time.Hour {
			t.Skip()
		}
		now := time.UnixMicro(us)
		begin, end := bounds(now, w)
		if w.kind == kindSliding || w.kind == kindConcurrent {
			if !begin.IsZero() || !end.IsZero() {
				t.Fatalf("%v at %v: bounds [%v, %v), want none", w, now, begin, end)
			}
			return
		}
		if begin.After(now) {
			t.Fatalf("%v at %v: begin %v after now", w, now, begin)
		}
		if w.kind == kindLifetime {
			if !end.IsZero() {
				t.Fatalf("lifetime end = %v, want zero", end)
			}
			return
		}
		if !end.After(now) {
			t.Fatalf("%v at %v: end %v not after now", w, now, end)
		}
		if begin.Nanosecond()%1000 != 0 || end.Nanosecond()%1000 != 0 {
			t.Fatalf("%v at %v: bounds %v, %v finer than microseconds", w, now, begin, end)
		}
		if w.kind != kindFixed && w.kind != kindCalendar {
			return
		}
		if b2, e2 := bounds(begin, w); !b2.Equal(begin) || !e2.Equal(end) {
			t.Fatalf("%v: from now %v got [%v, %v); from its begin got [%v, %v)", w, now, begin, end, b2, e2)
		}
		last := end.Add(-time.Microsecond)
		if b2, e2 := bounds(last, w); !b2.Equal(begin) || !e2.Equal(end) {
			t.Fatalf("%v: from now %v got [%v, %v); from its last µs got [%v, %v)", w, now, begin, end, b2, e2)
		}
		if b3, _ := bounds(end, w); !b3.Equal(end) {
			t.Fatalf("%v: window [%v, %v) is followed by one beginning %v", w, begin, end, b3)
		}
		if w.kind == kindCalendar {
			if l := end.Sub(begin); l < 22*time.Hour || l > 367*24*time.Hour {
				t.Fatalf("%v: window [%v, %v) is %v long", w, begin, end, l)
			}
		}
	})
}

func TestCalendarDSTDays(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		day  time.Time
		want time.Duration
	}{
		{time.Date(2026, 3, 8, 12, 0, 0, 0, ny), 23 * time.Hour},
		{time.Date(2026, 11, 1, 12, 0, 0, 0, ny), 25 * time.Hour},
		{time.Date(2026, 7, 1, 12, 0, 0, 0, ny), 24 * time.Hour},
	} {
		b, e := bounds(tc.day, Calendar(Day, ny))
		if got := e.Sub(b); got != tc.want {
			t.Errorf("day of %s: [%v, %v) is %v, want %v", tc.day.Format("2006-01-02"), b, e, got, tc.want)
		}
	}
}

func TestWindowString(t *testing.T) {
	sh, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	for w, want := range map[Window]string{
		Rolling(time.Minute):    "rolling 1m0s",
		Fixed(time.Hour):        "fixed 1h0m0s",
		Sliding(time.Second):    "sliding 1s",
		Smooth(time.Second, 20): "smooth 1s burst 20",
		Lifetime():              "lifetime",
		Calendar(Month, sh):     "calendar month Asia/Shanghai",
		{}:                      "invalid window",
		Calendar(Week, nil):     "calendar week",
		Calendar(Unit(7), sh):   "calendar Unit(7) Asia/Shanghai",
	} {
		if got := w.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

// TestMicroIsTruncate: micro is Truncate(time.Microsecond), monotonic
// reading dropped, for clock reads and for times far before and after
// the epoch, in UTC and in another zone.
func TestMicroIsTruncate(t *testing.T) {
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	times := []time.Time{time.Now(), time.Now().In(shanghai), {}, time.Unix(0, 0), time.Unix(-1, 999_999_999)}
	for range 10000 {
		ts := time.Unix(rng.Int64N(1<<36)-1<<35, rng.Int64N(1e9))
		times = append(times, ts, ts.In(shanghai))
	}
	for _, ts := range times {
		want, got := ts.Truncate(time.Microsecond), micro(ts)
		if got != want || got.Location() != want.Location() {
			t.Fatalf("micro(%v) = %v, want %v", ts, got, want)
		}
	}
}

// TestWallClockIsTimeNow: the default clock reads the clock time.Now reads,
// to the microsecond, with no monotonic reading, in time.Local, and micro
// leaves its readings as they are.
func TestWallClockIsTimeNow(t *testing.T) {
	for range 1000 {
		before := time.Now().Truncate(time.Microsecond)
		got := wallClock()
		after := time.Now()
		if got.Before(before) || got.After(after) {
			t.Fatalf("wallClock() = %v, not between time.Now's %v and %v", got, before, after)
		}
		if got != got.Round(0) {
			t.Fatalf("wallClock() = %v carries a monotonic reading", got)
		}
		if got.Location() != time.Local {
			t.Fatalf("wallClock() is in %v, want time.Local", got.Location())
		}
		if m := micro(got); m != got {
			t.Fatalf("micro(wallClock()) = %v, want it unchanged: %v", m, got)
		}
	}
}

// BenchmarkCalendarBounds is the window math of a Calendar(Day) call, in
// a zone with daylight saving time.
func BenchmarkCalendarBounds(b *testing.B) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		b.Fatal(err)
	}
	w := Calendar(Day, ny)
	now := time.Date(2026, 11, 27, 15, 4, 5, 0, time.UTC)
	for b.Loop() {
		bounds(now, w)
	}
}

// TestSmoothInterval: a Smooth rule's emission interval is period/Limit
// rounded up to the microsecond, never down (a rule never admits more
// than its rate), computed without overflow for the largest limits.
func TestSmoothInterval(t *testing.T) {
	for _, c := range []struct {
		period time.Duration
		limit  int64
		want   time.Duration
	}{
		{time.Second, 10, 100 * time.Millisecond},
		{time.Second, 3, 333334 * time.Microsecond},
		{time.Second, 1_000_000, time.Microsecond},
		{time.Second, 999_999, 2 * time.Microsecond},      // 1.000001µs
		{1500 * time.Nanosecond, 1, 2 * time.Microsecond}, // a period finer than the stores keep
		{time.Minute, 0, time.Minute},
		{time.Minute, 1, time.Minute},
		{expose.MaxDuration, expose.MaxLimit, time.Microsecond},
	} {
		if got := interval(c.period, c.limit); got != c.want {
			t.Errorf("interval(%v, %d) = %v, want %v", c.period, c.limit, got, c.want)
		}
		if got := Smooth(c.period, 1).smoothInterval(c.limit); got != c.want {
			t.Errorf("Smooth(%v, 1).smoothInterval(%d) = %v, want %v", c.period, c.limit, got, c.want)
		}
	}
	for _, w := range []Window{Fixed(time.Second), Sliding(time.Second), Lifetime(), {}} {
		if got := w.smoothInterval(10); got != 0 {
			t.Errorf("%v.smoothInterval(10) = %v, want 0", w, got)
		}
	}
	if got := Smooth(time.Second, 1).smoothInterval(-1); got != 0 {
		t.Errorf("Interval(-1) = %v, want 0", got)
	}
}

// TestSmoothBoundsAreExact: the largest Smooth rules validation takes
// keep every time a store compares within 100 years, so under 2^53
// microseconds.
func TestSmoothBoundsAreExact(t *testing.T) {
	for _, r := range []Rule{
		{UseType: "u", Limit: 1, Window: Smooth(365*24*time.Hour, 100)},
		{UseType: "u", Limit: 1_000_000, Window: Smooth(time.Second, int64(expose.MaxDuration/time.Microsecond))},
		{UseType: "u", Limit: int64(expose.MaxDuration / time.Microsecond), Window: Smooth(expose.MaxDuration, 1)},
	} {
		if err := r.Validate(); err != nil {
			t.Errorf("%v limit %d: %v", r.Window, r.Limit, err)
			continue
		}
		if bt := r.Window.burst * interval(r.Window.d, r.Limit).Microseconds(); bt > int64(expose.MaxDuration/time.Microsecond) || bt >= 1<<53 {
			t.Errorf("%v limit %d: burst*interval = %dµs", r.Window, r.Limit, bt)
		}
	}
}
