package countlimit

import (
	"fmt"
	"strconv"
	"time"

	"github.com/countlimit/countlimit/internal/expose"
)

// Unit is a calendar unit for [Calendar] windows.
type Unit int

// The calendar units. Weeks are ISO weeks: they begin on Monday.
const (
	Day Unit = iota + 1
	Week
	Month
	Year
)

// name is "day", "week", "month" or "year".
func (u Unit) name() string {
	switch u {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return fmt.Sprintf("Unit(%d)", int(u))
}

type windowKind uint8

const (
	kindRolling windowKind = iota + 1
	kindFixed
	kindCalendar
	kindSliding
	kindLifetime
	kindConcurrent
	kindSmooth
)

// Window says when counted events stop counting. Windows are small values,
// safe to copy and share between goroutines. The zero Window is invalid: a
// call made with it fails with [ErrInvalid].
type Window struct {
	kind windowKind
	unit Unit
	d    time.Duration
	loc  *time.Location
	// burst is a Smooth window's; 0 for every other kind.
	burst int64
	// iv is a Smooth window's interval for the Limit its rule was
	// validated with, kept on the Limiter's own copy of the rule so that
	// a call divides once (validateSmooth sets it, setCheck reads it);
	// 0 in every Window a caller holds.
	iv time.Duration
}

// Rolling returns a window of length d that begins at the first counted
// event after the previous window ended (the CheckLimit model with
// beginTime = now). Denied calls never start a window.
func Rolling(d time.Duration) Window { return Window{kind: kindRolling, d: d} }

// Fixed returns windows of length d aligned to multiples of d since the Unix
// epoch, in UTC: Fixed(time.Hour) resets on every full hour.
func Fixed(d time.Duration) Window { return Window{kind: kindFixed, d: d} }

// Calendar returns natural calendar windows in loc: a Day runs from midnight
// to midnight (23 or 25 hours on daylight-saving days), a Week from Monday
// midnight, a Month from the first, a Year from January 1st. A period
// begins at the first instant whose date in loc is its first day: where
// midnight happens twice (clocks back from 01:00 to 00:00) at the first,
// where it does not happen (forward from 00:00 to 01:00) at the change.
func Calendar(u Unit, loc *time.Location) Window {
	return Window{kind: kindCalendar, unit: u, loc: loc}
}

// Sliding returns an exact sliding log: at most Limit events in any span of
// length d. It stores one timestamp per counted event, so its cost grows with
// Limit; prefer Fixed or Rolling for large limits.
func Sliding(d time.Duration) Window { return Window{kind: kindSliding, d: d} }

// Lifetime returns a window that never ends: Limit events ever, until Reset.
func Lifetime() Window { return Window{kind: kindLifetime} }

// Concurrent returns a window of slots instead of events: Limit is how many
// may be held at once, taken with [Limiter.Acquire] and given back with
// [Lease.Release]. A slot held longer than ttl since it was taken or last
// extended ([Lease.Extend]) frees itself, so a holder that crashes leaks
// nothing for longer than ttl. Allow, AllowN, AllowAll and Refund refuse a
// Concurrent rule; Peek and Reset take it.
func Concurrent(ttl time.Duration) Window { return Window{kind: kindConcurrent, d: ttl} }

// Smooth returns a smooth rate with bursts, decided by GCRA as
// go-redis/redis_rate decides: the rule's Limit events per period, evenly,
// one every period/Limit (the emission interval), with up to burst at
// once. Rule{Limit: 10, Window: Smooth(time.Second, 20)} is 10 a second
// with bursts of up to 20: a fresh id may take 20 at once, then one more
// every 100ms, and one that rests for 2s may take 20 at once again.
//
// Each id keeps one instant, the theoretical arrival time (TAT): when its
// events so far are drained at the rule's rate. An event of weight n fits
// when the TAT, moved n intervals on, is at most burst intervals past now;
// counted, it moves the TAT so. So the stored state is O(1) per id,
// whatever the rate.
//
// The interval is rounded up to the microsecond, the stores' precision,
// so a rule never admits more than its rate: 3 per second is one every
// 333334µs. A rate of more than one per microsecond (period/Limit under
// 1µs) is ErrInvalid. period must be 1µs to 100 years, burst 1 to 2^53,
// and draining a whole burst (burst intervals) must take at most 100
// years; otherwise calls fail with ErrInvalid naming Rule.Window. A weight
// n above burst never fits: AllowN denies it with RetryAfter RetryNever, as other
// kinds deny n above Limit. Limit 0 allows nothing.
//
// In a Result, Used is the events not yet drained (rounded up), Remaining
// is burst - Used (how many fit at once now), ResetAt is when the id is
// fully drained (now when it is), and RetryAfter is exact: the wait until
// the call's weight fits. Refund moves the TAT back n intervals, never
// before now. Denials change nothing but the denial tally and the penalty.
func Smooth(period time.Duration, burst int64) Window {
	return Window{kind: kindSmooth, d: period, burst: burst}
}

// String describes the window, e.g. "fixed 1h0m0s" or "calendar day Asia/Shanghai".
func (w Window) String() string {
	switch w.kind {
	case kindRolling:
		return "rolling " + w.d.String()
	case kindFixed:
		return "fixed " + w.d.String()
	case kindSliding:
		return "sliding " + w.d.String()
	case kindConcurrent:
		return "concurrent " + w.d.String()
	case kindSmooth:
		return "smooth " + w.d.String() + " burst " + strconv.FormatInt(w.burst, 10)
	case kindLifetime:
		return "lifetime"
	case kindCalendar:
		if w.loc == nil {
			return "calendar " + w.unit.name()
		}
		return "calendar " + w.unit.name() + " " + w.loc.String()
	}
	return "invalid window"
}

// duration is the length of a Rolling, Fixed or Sliding window, the lease
// ttl of a Concurrent one, the period of a Smooth one, and 0 for Calendar
// windows (a day or a month has no single length) and Lifetime.
func (w Window) duration() time.Duration {
	switch w.kind {
	case kindRolling, kindFixed, kindSliding, kindConcurrent, kindSmooth:
		return w.d
	}
	return 0
}

// smoothInterval is a Smooth window's emission interval under a rule of
// the given limit (see expose.Interval); 0 for every other kind, or a
// limit below 0.
func (w Window) smoothInterval(limit int64) time.Duration {
	if w.kind != kindSmooth || limit < 0 {
		return 0
	}
	return interval(w.d, limit)
}

// validate reports why w cannot be used, naming the field.
func (w Window) validate() error {
	switch w.kind {
	case kindRolling, kindFixed, kindSliding, kindConcurrent:
		if w.d < time.Microsecond || w.d > expose.MaxDuration {
			return invalidf("Rule.Window", "%s duration must be 1µs to 100 years, got %v", w.kindName(), w.d)
		}
	case kindSmooth:
		if w.d < time.Microsecond || w.d > expose.MaxDuration {
			return invalidf("Rule.Window", "smooth period must be 1µs to 100 years, got %v", w.d)
		}
		if w.burst < 1 || w.burst > expose.MaxLimit {
			return invalidf("Rule.Window", "smooth burst must be 1 to 2^53, got %d", w.burst)
		}
	case kindCalendar:
		if w.unit < Day || w.unit > Year {
			return invalidf("Rule.Window", "calendar unit %d is not Day, Week, Month or Year", int(w.unit))
		}
		if w.loc == nil {
			return invalidf("Rule.Window", "calendar location is nil")
		}
	case kindLifetime:
	default:
		return invalidf("Rule.Window", "zero Window; use Rolling, Fixed, Calendar, Sliding, Lifetime, Concurrent or Smooth")
	}
	return nil
}

func (w Window) kindName() string {
	switch w.kind {
	case kindRolling:
		return "rolling"
	case kindFixed:
		return "fixed"
	case kindSliding:
		return "sliding"
	case kindConcurrent:
		return "concurrent"
	case kindSmooth:
		return "smooth"
	case kindCalendar:
		return "calendar"
	case kindLifetime:
		return "lifetime"
	}
	return "window"
}

// bounds returns the window a counted event at now would open: [begin, end).
// end is the zero Time for Lifetime windows. Sliding and Concurrent windows
// and Smooth windows have no bounds: both are zero for them. now must already be truncated to
// microseconds and w must be valid.
func bounds(now time.Time, w Window) (begin, end time.Time) {
	switch w.kind {
	case kindRolling:
		return now, now.Add(truncMicro(w.d))
	case kindFixed:
		d := int64(truncMicro(w.d) / time.Microsecond)
		us := now.UnixMicro()
		b := us - floorMod(us, d)
		return time.UnixMicro(b).UTC(), time.UnixMicro(b + d).UTC()
	case kindCalendar:
		return calendarBounds(now, w.unit, w.loc)
	case kindSliding, kindConcurrent, kindSmooth:
		return time.Time{}, time.Time{}
	}
	return now, time.Time{}
}

func calendarBounds(now time.Time, u Unit, loc *time.Location) (begin, end time.Time) {
	t := now.In(loc)
	y, m, d := t.Date()
	switch u {
	case Day:
		return dayStart(y, m, d, loc), dayStart(y, m, d+1, loc)
	case Week:
		d -= (int(t.Weekday()) + 6) % 7 // days since Monday
		return dayStart(y, m, d, loc), dayStart(y, m, d+7, loc)
	case Month:
		return dayStart(y, m, 1, loc), dayStart(y, m+1, 1, loc)
	}
	return dayStart(y, 1, 1, loc), dayStart(y+1, 1, 1, loc)
}

// maxOffset bounds how far any zone's clock has been from UTC: the widest
// offsets in the tz database are local mean times of the 19th century
// (America/Sitka +14:58, Asia/Manila -15:56).
const maxOffset = 16 * 60 * 60

// dayStart returns when the day y-m-d (normalised, so d may overflow)
// begins in loc: the first instant whose local date is that day or later.
// Where midnight happens twice (clocks back from 01:00 to 00:00, Asia/Amman
// in 2021) that is the first midnight, where it does not happen (forward
// from 00:00 to 01:00, America/Santiago) the change, and where the whole
// day is skipped (Pacific/Apia, 2011-12-30) the next day's start. time.Date
// alone may answer the second midnight in the first case and an hour early
// in the second.
//
// It walks loc's zone periods forward from maxOffset before the day's
// midnight in UTC, which no clock reads as that day, to the first period
// whose clock reaches midnight before the period ends: usually the first.
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	wall := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() // the midnight, read as UTC
	t := time.Unix(wall-maxOffset, 0).In(loc)
	for {
		_, offset := t.Zone()
		end := periodEnd(t, loc)
		at := max(t.Unix(), wall-int64(offset)) // the period may begin past midnight: the day began with it
		if end.IsZero() || at < end.Unix() {
			return time.Unix(at, 0).In(loc)
		}
		t = end
	}
}

// periodEnd returns when the zone period that holds t ends in loc (t's
// location), or the zero Time if it never does. Some periods are cut in
// two, at a year's end, which is no change of the clock's offset.
func periodEnd(t time.Time, loc *time.Location) time.Time {
	_, end := t.ZoneBounds()
	if end.IsZero() || end.After(t) {
		return end
	}
	// On the last UTC day of a leap year, past a zone's last listed change
	// (the years its rule string covers), ZoneBounds answers an end before
	// t (golang/go#81583): the period runs on into the next year, where
	// ZoneBounds answers it right. Failing that, the next second, so a
	// walk over periods always moves on.
	_, end = time.Date(t.UTC().Year()+1, 1, 1, 0, 0, 0, 0, time.UTC).In(loc).ZoneBounds()
	if end.IsZero() || end.After(t) {
		return end
	}
	return t.Add(time.Second)
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// interval is a valid Smooth rule's emission interval: period/Limit
// rounded up to the microsecond (period when Limit is 0, which allows
// nothing). Two roundings up are one: ceil(ceil(p/L)/1000) = ceil(p/1000L),
// without the product, which may overflow.
func interval(period time.Duration, limit int64) time.Duration {
	ns := int64(period)
	if limit > 1 {
		ns = (ns + limit - 1) / limit
	}
	return time.Duration((ns+999)/1000) * time.Microsecond
}

func truncMicro(d time.Duration) time.Duration { return d.Truncate(time.Microsecond) }

// micro is t.Truncate(time.Microsecond), the stores' precision, without
// Truncate's general division, which is a noticeable part of an in-memory
// Allow: a second is a whole number of microseconds, so only t's
// nanoseconds change. Like Truncate, it drops the monotonic clock reading.
func micro(t time.Time) time.Time {
	return t.Add(-time.Duration(t.Nanosecond() % 1000)).Round(0)
}
