// Package model is the reference model of the driver.Store contract: one
// pure function, Apply, that takes the stored state of a request's keys,
// the request and its "now", and returns the new state and every check's State, for every operation
// (allow, peek, refund, reset, acquire, release, extend), every kind of
// window, several rules at once, penalties and changed limits.
//
// Every store decides as Apply does, each in its own code and language for
// speed (docs/ARCHITECTURE.md lists the copies and why each stays); the
// seeded differential harness (internal/testkit/modeltest) drives every path of
// every store and Apply through the same random steps and compares the
// stored states they leave, so that a copy that drifts is found. A change
// to one rule of the contract is made here first.
package model

import (
	"math"
	"slices"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// Forever is the end of a lifetime window.
const Forever = math.MaxInt64

// Key is the stored state of one (use type, id), in Unix microseconds: what
// a store keeps for it and what the harness reads back from each store.
// The zero Key is a key with nothing stored.
//
// A key is kept in the form of the kind of window that last counted in it:
// a window's count, a sliding log (Log) or a smooth instant (TAT). Every
// form also keeps a count over a window (Count, Begin, End), which is what
// a check of another kind carries over when it reads the key (see look):
// that is how one count is kept per (use type, id) whichever kind of
// window asks.
type Key struct {
	// The window of counts: Count events in [Begin, End); End is Forever
	// for a lifetime window. Begin == End is no window: an empty one, as a
	// denial of a key with nothing counted leaves. A sliding log keeps
	// here its length and [Log[0], Log[len-1]+span) as it was when last
	// written; a smooth key its units not yet drained when last written,
	// over [0, TAT).
	Count, Begin, End int64
	// Log is a sliding window's events, in time order: the window is then
	// [Log[0], Log[len-1]+span) and Count is len(Log).
	Log []int64
	// Denied is the denial tally since the key was created.
	Denied int64
	// Blocked is when the penalty ends; 0 when the key was never blocked.
	Blocked int64
	// Leases are a Concurrent check's leases: token to expiry.
	Leases map[string]int64
	// TAT is a Smooth check's theoretical arrival time: when the key is
	// drained. 0 when none is kept; a TAT at or before now is drained as
	// well, and a store may drop it. End is TAT too while it is kept.
	TAT int64
}

func us(t time.Time) int64 { return t.UnixMicro() }

// end is a Check's window end in microseconds: Forever for a lifetime.
func end(c *driver.Check) int64 {
	if c.End.IsZero() {
		return Forever
	}
	return us(c.End)
}

func tm(v int64) time.Time {
	if v == 0 || v == Forever {
		return time.Time{}
	}
	return time.UnixMicro(v)
}

// view is what a check sees of its key at now: the count in the current
// window and its bounds, or the fresh window an event would open.
type view struct {
	used       int64
	begin, end int64
	live       []int64 // a sliding check's events still in its window
	blocked    bool
	ahead      int64 // a smooth check's max(TAT, now) - now
	// until is set for a sliding or smooth check that carries over the
	// count of a key of another kind (see carried): the end of the window
	// that holds it. A sliding check's used events are then all logged at
	// begin.
	until int64
}

// carried is the count a check of another kind reads from k at now, and
// the end of the window that holds it: its window's, while that window is
// current (not empty, not over); 0 and 0 otherwise. A window's count, a
// sliding log's length and a smooth key's undrained units are all kept
// there (see Key).
func carried(k *Key, now int64) (count, until int64) {
	if k.Begin < k.End && now < k.End && k.Count > 0 {
		return k.Count, k.End
	}
	return 0, 0
}

// look is what check c sees of key k at now. A key kept in the form of
// another kind of window is carried over as a count, held until the window
// that holds it ends: a sliding check sees that many events logged at the
// latest instant that lets them leave the log when that window ends, and
// never after now (min(now, until - span)); a smooth check sees that many
// units taken at now (a full burst at the most), and, denied, room when
// that window ends. A check of a kind that counts in windows joins
// whatever window is current, a sliding log's or a smooth key's included.
// So a change of a rule's kind carries its count over, and two rules of
// different kinds on one use type never let an id through more often than
// the larger limit in a window of either.
func look(k *Key, c *driver.Check, now int64) view {
	v := view{blocked: k.Blocked > now}
	if c.Smooth() {
		if k.TAT > 0 {
			v.ahead = max(k.TAT, now) - now
		} else if m, until := carried(k, now); m > 0 {
			v.ahead, v.until = min(m, c.Burst)*c.Interval.Microseconds(), until
		}
		v.used = drained(c, v.ahead)
		return v
	}
	if span := c.Span.Microseconds(); span > 0 {
		if len(k.Log) == 0 {
			if m, until := carried(k, now); m > 0 {
				at := min(now, until-span)
				v.used, v.begin, v.end, v.until = m, at, at+span, until
			}
			return v
		}
		for _, e := range k.Log {
			if e > now-span {
				v.live = append(v.live, e)
			}
		}
		if v.used = int64(len(v.live)); v.used > 0 {
			v.begin, v.end = v.live[0], v.live[len(v.live)-1]+span
		}
		return v
	}
	// Current: not empty, not over. Begin is not compared with now.
	if k.Begin < k.End && now < k.End {
		v.used, v.begin, v.end = k.Count, k.Begin, k.End
		return v
	}
	v.begin, v.end = us(c.Begin), end(c)
	return v
}

// logged returns the events of a sliding check's view: the live part of
// its log, or for a count carried over from another kind, that many
// events at the view's begin.
func (v *view) logged() []int64 {
	if v.until > 0 {
		return slices.Repeat([]int64{v.begin}, int(v.used))
	}
	return slices.Clone(v.live)
}

func (v *view) fits(c *driver.Check, n int64) bool {
	if c.Smooth() {
		return !v.blocked && smoothFits(c, v.ahead, n)
	}
	return !v.blocked && n <= c.Limit-v.used
}

// smoothFits reports whether n more units fit a smooth check whose key
// is drained ahead after now, the penalty aside: ahead + n*T <= B*T,
// with n*T taken only once n <= B, so nothing overflows.
func smoothFits(c *driver.Check, ahead, n int64) bool {
	t := c.Interval.Microseconds()
	return c.Limit > 0 && n <= c.Burst && ahead+n*t <= c.Burst*t
}

// drained is a smooth check's Used: the units not yet drained,
// ceil(ahead/T), between 0 and Burst.
func drained(c *driver.Check, ahead int64) int64 {
	t := c.Interval.Microseconds()
	return min(c.Burst, (ahead+t-1)/t)
}

// Apply carries out r at r.Now on keys, the stored state of r's checks in
// order (keys[i] is that of r.Checks[i]), in place, and writes each
// check's State. The checks of r have distinct use types, as the Limiter
// makes sure. Apply is the Store contract spelled out as code: the
// executable specification every store is held to (docs/ARCHITECTURE.md).
// It does no I/O and reads no clock.
func Apply(r *driver.Request, keys []*Key) {
	now := us(r.Now)
	switch {
	case r.Op == driver.OpReset:
		for i := range keys {
			*keys[i] = Key{}
			r.Checks[i].State = driver.State{}
		}
		return
	case r.OnLeases():
		applyLease(r, keys[0], now)
		return
	}
	n := r.N
	if r.Op != driver.OpAllow {
		n = 1
	}
	views := make([]view, len(r.Checks))
	ok := true
	for i := range r.Checks {
		c, k := &r.Checks[i], keys[i]
		if r.Op == driver.OpRefund {
			refund(k, c, now, r.N)
		}
		views[i] = look(k, c, now)
		ok = ok && views[i].fits(c, n)
	}
	for i := range r.Checks {
		c, k, v := &r.Checks[i], keys[i], &views[i]
		st := driver.State{Allowed: ok}
		if r.Op == driver.OpAllow {
			switch {
			case ok && c.Smooth():
				v.ahead += n * c.Interval.Microseconds()
				v.used = drained(c, v.ahead)
				tat := now + v.ahead
				*k = Key{Count: v.used, End: tat, Denied: k.Denied, Blocked: k.Blocked, Leases: k.Leases, TAT: tat}
			case ok && c.Span > 0:
				span := c.Span.Microseconds()
				log := v.logged()
				at, _ := slices.BinarySearch(log, now+1) // after any equal ones
				log = slices.Insert(log, at, slices.Repeat([]int64{now}, int(n))...)
				k.Log, k.Count = log, int64(len(log))
				k.Begin, k.End = log[0], log[len(log)-1]+span
				k.TAT = 0 // counting with another kind drops a smooth instant
				*v = view{used: k.Count, begin: k.Begin, end: k.End, live: log}
			case ok:
				k.Count, k.Begin, k.End = v.used+n, v.begin, v.end
				k.Log = nil // counting with a window drops a sliding log
				k.TAT = 0
				v.used += n
			case !v.fits(c, n):
				k.Denied++
				if !v.blocked && c.Block > 0 {
					k.Blocked = now + c.Block.Microseconds()
				}
			}
		}
		st.Used = v.used
		switch {
		case c.Smooth():
			if v.ahead > 0 {
				st.End = tm(now + v.ahead)
			}
		case c.Span == 0 || v.used > 0:
			st.Begin, st.End = tm(v.begin), tm(v.end)
		}
		if k.Blocked > now {
			st.BlockedUntil = tm(k.Blocked)
		}
		if c.Span > 0 && !ok && n <= c.Limit && v.used+n > c.Limit {
			if v.until > 0 {
				// A carried count leaves the log when its window ends (a
				// lifetime window's, never).
				if v.until != Forever {
					st.FreeAt = tm(v.until - c.Span.Microseconds())
				}
			} else {
				st.FreeAt = tm(v.live[v.used+n-c.Limit-1])
			}
		}
		if c.Smooth() && !ok && c.Limit > 0 && n <= c.Burst && !smoothFits(c, v.ahead, n) {
			t := c.Interval.Microseconds()
			st.FreeAt = tm(now + v.ahead + n*t - c.Burst*t)
			if v.until > 0 {
				st.FreeAt = tm(v.until) // a carried count drains when its window ends (a lifetime's: never)
			}
		}
		c.State = st
	}
}

// refund gives n events back to the current window of c's key, never
// below 0, in the form the key is kept in: a sliding check drops its n
// newest events, a smooth check moves the TAT back n intervals (its count
// becomes the units still undrained), any other check lowers the count;
// a check of another form than the key's gives back nothing of the key's
// log or smooth instant.
func refund(k *Key, c *driver.Check, now, n int64) {
	if c.Smooth() {
		if ahead, t := k.TAT-now, c.Interval.Microseconds(); ahead > 0 {
			if n >= (ahead+t-1)/t {
				k.TAT = now
			} else {
				k.TAT -= n * t
			}
			k.End, k.Count = k.TAT, drained(c, k.TAT-now)
		}
		return
	}
	v := look(k, c, now)
	if span := c.Span.Microseconds(); span > 0 {
		if len(k.Log) == 0 {
			return
		}
		keep := v.live[:max(0, v.used-n)]
		k.Log, k.Count = slices.Clone(keep), int64(len(keep))
		if len(keep) > 0 {
			k.Begin, k.End = keep[0], keep[len(keep)-1]+span
		}
		return
	}
	if v.used > 0 {
		k.Count = max(0, k.Count-n)
	}
}

// applyLease carries out a request on a Concurrent check's leases.
func applyLease(r *driver.Request, k *Key, now int64) {
	c := &r.Checks[0]
	live := map[string]int64{}
	for t, e := range k.Leases {
		if e > now {
			live[t] = e
		}
	}
	blocked := k.Blocked > now
	fits := !blocked && int64(len(live))+1 <= c.Limit
	allowed := false
	switch r.Op {
	case driver.OpPeek:
		allowed = fits
	case driver.OpAcquire:
		allowed = fits
		if fits {
			live[r.Lease] = now + c.TTL.Microseconds()
		} else {
			k.Denied++
			if !blocked && c.Block > 0 {
				k.Blocked = now + c.Block.Microseconds()
			}
		}
		k.Leases = live // a write drops the expired leases
	case driver.OpRelease, driver.OpExtend:
		if _, held := live[r.Lease]; held {
			allowed = true
			if r.Op == driver.OpRelease {
				delete(live, r.Lease)
			} else {
				live[r.Lease] = now + c.TTL.Microseconds()
			}
			k.Leases = live
		}
	}
	if len(k.Leases) == 0 {
		k.Leases = nil
	}
	st := driver.State{Allowed: allowed, Used: int64(len(live))}
	if len(live) > 0 {
		first, last := int64(Forever), int64(0)
		for _, e := range live {
			first, last = min(first, e), max(last, e)
		}
		st.Begin, st.End = tm(first), tm(last)
	}
	if k.Blocked > now {
		st.BlockedUntil = tm(k.Blocked)
	}
	c.State = st
}
