// How a check is decided on a counter: what it finds (look), whether it
// fits, and what it writes back.

package memstore

import (
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/wire"
)

// view is a check's current window as an entry shows it at now.
type view struct {
	used       int64
	begin, end int64
	live       int // sliding: index of the oldest event still in the window
	blocked    bool
	ahead      int64 // smooth: max(TAT, now) - now
	// until is set for a sliding or smooth check that carries over the
	// count of an entry of another kind (model.Apply's look): the end of
	// the window that holds it. A sliding check's used events are then all
	// at begin.
	until int64
}

// smooth reports whether e is a Smooth check's entry: its begin is
// negative (smoothBegin), which no window's begin is (the Limiter takes
// no time before 1970).
func (e *entry) smooth() bool { return e.begin < 0 }

// smoothBegin is the begin of a smooth entry whose janitor deadline was
// last set for the instant at (µs, after 1970): -at, negative.
func smoothBegin(at int64) int64 { return -at }

// carried is the count a check of another kind reads from e at now, and
// the end of the window that holds it: its window's while the window is
// current, else 0 and 0 (model.Apply's carried). A smooth entry's window
// is [0, TAT).
func (e *entry) carried(now int64) (count, until int64) {
	if e.begin < e.end && now < e.end && e.count > 0 {
		return e.count, e.end
	}
	return 0, 0
}

// smoothSlack is how far past its TAT a smooth entry's janitor deadline is
// set (µs), so that a key allowed again and again moves the deadline, and
// reads the monotonic clock, about once a second rather than on every
// allow. The entry outlives its TAT by at most this.
const smoothSlack = int64(time.Second / time.Microsecond)

// expiryGrace is how long past its end (µs) the janitor keeps a counter,
// a penalty or a set of leases: a check whose clock was read before the
// end but that reaches its shard after it (a goroutine descheduled, a
// shard's lock waited for, a sweep between the two) still finds what the
// window counted, as redisstore's keys outlive their ends by a second too.
// Without it such a check would find nothing and count from zero in a
// window that was full. Checks never read it: what has ended counts
// nothing either way; the store only holds the bytes a second longer.
const expiryGrace = int64(time.Second / time.Microsecond)

// until is when the entry's window ends, or for a smooth entry the later
// of its TAT and the instant its janitor deadline was set for (begin).
func (e *entry) until() int64 {
	if e.smooth() {
		return max(e.end, -e.begin)
	}
	return e.end
}

// look sets v to the check's current window as e shows it at now. It
// writes v in place, as write does: returned by value, views were copied
// through the stack several times a check.
func look(v *view, e *entry, c *driver.Check, now int64) {
	*v = view{}
	span := c.Span.Microseconds()
	if c.Interval > 0 {
		if e != nil {
			v.blocked = e.blocked > now
			if !e.smooth() {
				if m, until := e.carried(now); m > 0 {
					v.ahead, v.until = min(m, c.Burst)*c.Interval.Microseconds(), until
				}
			} else if e.end > now {
				v.ahead = e.end - now
			}
		}
		v.used = drained(c, v.ahead)
		return
	}
	if e != nil {
		v.blocked = e.blocked > now
		if span > 0 && len(e.events) == 0 {
			if m, until := e.carried(now); m > 0 {
				at := min(now, until-span)
				v.used, v.begin, v.end, v.until = m, at, at+span, until
			}
			return
		}
		if span > 0 {
			for v.live < len(e.events) && e.events[v.live] <= now-span {
				v.live++
			}
			if v.used = int64(len(e.events) - v.live); v.used > 0 {
				v.begin, v.end = e.events[v.live], e.events[len(e.events)-1]+span
			}
			return
		}
		if e.begin < e.end && now < e.end {
			v.used, v.begin, v.end = e.count, max(e.begin, 0), e.end
			return
		}
	}
	if span > 0 {
		return // its log is a sliding check's window: c.Begin and c.End mean nothing
	}
	v.begin, v.end = c.Begin.UnixMicro(), wire.Micros(c.End, forever)
}

func (v *view) fits(c *driver.Check, n int64) bool {
	if c.Interval > 0 {
		return !v.blocked && smoothFits(c, v.ahead, n)
	}
	return !v.blocked && n <= c.Limit-v.used
}

// smoothFits reports whether n more units fit a Smooth check drained
// ahead after now, the penalty aside (model.Apply's rule): ahead + n*T
// <= B*T, with n*T taken only once n <= B.
func smoothFits(c *driver.Check, ahead, n int64) bool {
	t := c.Interval.Microseconds()
	return c.Limit > 0 && n <= c.Burst && ahead+n*t <= c.Burst*t
}

// drained is a Smooth check's Used: ceil(ahead/T), at most Burst.
func drained(c *driver.Check, ahead int64) int64 {
	t := c.Interval.Microseconds()
	return min(c.Burst, (ahead+t-1)/t)
}

// write counts n (allowed) or records the denial of an entry, and updates
// its view v.
func (s *Store) write(sh *shard, e *entry, c *driver.Check, v *view, allowed bool, n, now int64) {
	deadline := max(e.until(), e.blocked)
	switch span := c.Span.Microseconds(); {
	case !allowed:
		e.denied++
		if !v.blocked && c.Block > 0 {
			e.blocked = now + c.Block.Microseconds()
			v.blocked = true
		}
	case c.Interval > 0:
		v.ahead += n * c.Interval.Microseconds()
		v.used = drained(c, v.ahead)
		was := e.smooth()
		e.end, e.count = now+v.ahead, v.used
		e.events = e.events[:0]
		// A smooth entry's begin is the instant its janitor deadline was
		// last set for (see entry.until): it is moved, a clock read, only
		// once the TAT passes it, by smoothSlack at a time, not on every
		// allow of a busy key.
		if !was || -e.begin < e.end {
			e.begin = smoothBegin(e.end + smoothSlack)
			s.touch(sh, e, now)
		}
		return
	case span > 0 && v.until > 0:
		// Another kind's count, carried over: that many events at the
		// view's begin, then n at now.
		if want := int(v.used + n); want > cap(e.events) {
			e.events = make([]int64, 0, logCap(cap(e.events), want))
			sh.resize(e)
		}
		e.events = e.events[:0]
		for range v.used {
			e.events = append(e.events, v.begin)
		}
		for range n {
			e.events = append(e.events, now)
		}
		e.count = int64(len(e.events))
		e.begin, e.end = e.events[0], now+span
		v.used, v.begin, v.end, v.live, v.until = e.count, e.begin, e.end, 0, 0
	case span > 0:
		live := e.events[v.live:]
		if want := len(live) + int(n); want > cap(e.events) {
			log := make([]int64, len(live), logCap(cap(e.events), want))
			copy(log, live)
			e.events = log
			sh.resize(e)
		} else {
			e.events = append(e.events[:0], live...)
		}
		e.events = insertSorted(e.events, now, int(n))
		e.count = int64(len(e.events))
		e.begin, e.end = e.events[0], e.events[len(e.events)-1]+span
		v.used, v.begin, v.end, v.live = e.count, e.begin, e.end, 0
	default:
		e.count = v.used + n
		e.begin, e.end = v.begin, v.end
		e.events = e.events[:0]
		v.used += n
	}
	if e.expires == 0 || max(e.until(), e.blocked) != deadline {
		s.touch(sh, e, now)
	}
}

// refund gives n back as model.Apply's refund does, in the form e is kept
// in: a smooth entry's TAT, a sliding log, or a window's count.
func (s *Store) refund(e *entry, c *driver.Check, v *view, n int64) {
	if c.Interval > 0 {
		if t := c.Interval.Microseconds(); e.smooth() && v.ahead > 0 {
			now := e.end - v.ahead
			if n >= (v.ahead+t-1)/t {
				e.end = now // never before it
			} else {
				e.end -= n * t
			}
			e.count = drained(c, e.end-now)
		}
		return
	}
	if span := c.Span.Microseconds(); span > 0 {
		if len(e.events) == 0 {
			return // no log to give back from
		}
		keep := max(0, v.used-n)
		e.events = append(e.events[:0], e.events[v.live:v.live+int(keep)]...)
		e.count = keep
		if keep > 0 {
			e.begin, e.end = e.events[0], e.events[keep-1]+span
		}
		return
	}
	if v.used > 0 { // the stored window is current
		e.count = max(0, e.count-n)
	}
}

// insertSorted adds n events at t to a time-ordered log, after any equal
// ones: a caller whose clock read is older than the newest event still
// lands in order.
func insertSorted(log []int64, t int64, n int) []int64 {
	i := len(log)
	for i > 0 && log[i-1] > t {
		i--
	}
	for range n {
		log = append(log, 0)
	}
	copy(log[i+n:], log[i:len(log)-n])
	for j := i; j < i+n; j++ {
		log[j] = t
	}
	return log
}

// touch sets the janitor's deadline from the entry's window and penalty,
// expiryGrace after the later of their ends. A
// write calls it only when it moved the end of either, or the entry is new
// (expires 0): a check in a current window reads no clock but the
// Limiter's, and the deadline set when the window opened counts the same
// time down. A Limiter clock stepped against the monotonic one since then
// is followed at the next write that moves the window or the penalty.
func (s *Store) touch(sh *shard, e *entry, now int64) {
	mono := s.mono()
	ttl := max(e.until(), e.blocked, e.leases.last()) - now // µs
	if ttl >= (forever-mono)/int64(time.Microsecond)-expiryGrace {
		e.expires = forever // lifetime, or beyond what the clock can hold
		return
	}
	e.expires = mono + (ttl+expiryGrace)*int64(time.Microsecond)
	sh.soonest = min(sh.soonest, e.expires)
	sh.low = min(sh.low, e.expires)
}

// state writes c.State from its slot, after the lock is let go.
func state(c *driver.Check, sl *slot, allowed bool, now int64) {
	st, v := &c.State, &sl.v
	*st = driver.State{Allowed: allowed, Used: v.used}
	switch {
	case c.Interval > 0:
		if v.ahead > 0 {
			st.End = time.UnixMicro(now + v.ahead)
		}
	case c.Span == 0 || v.used > 0:
		st.Begin, st.End = wire.Time(v.begin, 0), wire.Time(v.end, forever) // a smooth key's window begins at 0: none
	}
	if sl.e != nil && sl.blocked > now {
		st.BlockedUntil = time.UnixMicro(sl.blocked)
	}
	if sl.free {
		st.FreeAt = time.UnixMicro(sl.freeAt)
	}
}
