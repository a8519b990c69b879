package countlimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// WithStoreClock makes the Limiter take "now" from its store's clock rather
// than its own, for fleets whose servers' clocks disagree: every process
// sharing the store then decides with the same time, as go-redis/redis_rate
// does by reading Redis's TIME. It panics in New if the store does not
// implement [driver.StoreClock].
//
// The store is not asked on every call. The Limiter reads the store's time
// on its first call and then once per resync (default one minute when
// resync <= 0), and adds the offset it measured to its own clock
// ([WithClock], default the system clock). The offset is measured to
// within half that read's round trip; between reads, the local clock's
// drift adds to the error (NTP-disciplined clocks drift far less than a
// millisecond a minute). The read that refreshes the offset is made by the
// one call that finds it stale, adding one round trip to that call; the
// others meanwhile use the previous offset. A reading outside 1970-2150
// UTC is a failed read: the store has failed, not the caller. If the very
// first read fails, the call fails with ErrUnavailable, as do the calls of
// the next second without another read (with [WithFallback], Allow and
// Peek are decided by the fallback store on the local clock: the store
// itself is never written on a clock it has not confirmed); a failed
// refresh keeps the previous offset.
//
// Skew without this option: each process decides with its own clock. A
// process whose clock runs ahead sees windows end early (a Fixed window
// restarts when its clock passes the window's end, which may let a burst
// through up to the skew early) and sets penalties that end later; stores
// never reset a window that another caller's clock considers current (see
// Store), so skew never loses counts, it moves window edges by the skew.
func WithStoreClock(resync time.Duration) Option {
	return func(l *Limiter) {
		sc, ok := l.store.(driver.StoreClock)
		if !ok {
			panic(fmt.Sprintf("countlimit: WithStoreClock: the store %T cannot tell its time (it does not implement driver.StoreClock)", l.store))
		}
		if resync <= 0 {
			resync = time.Minute
		}
		l.sclock = &storeClock{store: sc, resync: resync}
	}
}

// storeClock keeps the offset of the store's clock from the Limiter's.
type storeClock struct {
	store  driver.StoreClock
	resync time.Duration

	offset     atomic.Int64 // nanoseconds to add to the Limiter's clock: whole microseconds, as its readings are
	next       atomic.Int64 // when to refresh, Unix nanoseconds of the Limiter's clock; 0: never synced
	refreshing atomic.Bool
	first      sync.Mutex   // serialises the first read
	retry      atomic.Int64 // after a failed first read: when to try again, Unix nanoseconds
}

// errClockUnknown is the error of a call made while the store's clock has
// never been read: its first read failed, and the next is not due yet.
var errClockUnknown = fmt.Errorf("%w: the store's clock is not known yet (its first read failed; the next is due within a second)", ErrUnavailable)

// synced reports whether the store's clock has been read at least once.
func (sc *storeClock) synced() bool { return sc.next.Load() != 0 }

// clockFor reads the clock for a call about to go to the store: once,
// however many things need it. A reading outside the range every store
// keeps exactly (see checkTime) is ErrInvalid naming the clock: a clock
// set wrong is not a store failure.
func (l *Limiter) clockFor(ctx context.Context) (time.Time, error) {
	t := l.now()
	if sc := l.sclock; sc != nil {
		if err := l.syncClock(ctx, t); err != nil && (l.guarded == nil || l.guarded.fallback == nil) {
			return time.Time{}, err
		}
		t = t.Add(time.Duration(sc.offset.Load()))
	}
	if err := checkTime("clock", t); err != nil {
		return time.Time{}, err
	}
	return t, nil
}

// clock reads the Limiter's clock, corrected to the store's when
// WithStoreClock is set, at the stores' precision.
func (l *Limiter) clock() time.Time {
	t := l.now()
	if l.sclock != nil {
		t = t.Add(time.Duration(l.sclock.offset.Load()))
	}
	return t
}

// syncClock makes sure the offset is known and not stale at local time
// now. Only the first read's failure is returned.
func (l *Limiter) syncClock(ctx context.Context, now time.Time) error {
	sc := l.sclock
	next := sc.next.Load()
	switch {
	case next == 0:
		// Callers that arrive while the first read fails do not each wait
		// for one more read: they fail at once until the next is due.
		if now.UnixNano() < sc.retry.Load() {
			return errClockUnknown
		}
		sc.first.Lock()
		defer sc.first.Unlock()
		switch {
		case sc.synced():
			return nil
		case now.UnixNano() < sc.retry.Load():
			return errClockUnknown
		}
		err := l.readStoreClock(ctx)
		if err != nil {
			sc.retry.Store(l.now().Add(min(sc.resync, time.Second)).UnixNano())
		}
		return err
	case now.UnixNano() < next || !sc.refreshing.CompareAndSwap(false, true):
		return nil
	}
	defer sc.refreshing.Store(false)
	_ = l.readStoreClock(ctx) // on failure, keep the previous offset
	return nil
}

// readStoreClock measures the offset once.
func (l *Limiter) readStoreClock(ctx context.Context) error {
	sc := l.sclock
	if g := l.guarded; g != nil && g.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	t0 := l.now()
	st, err := sc.store.StoreTime(ctx)
	t1 := l.now()
	if err != nil {
		// Try again soon, not after a whole resync period.
		if sc.next.Load() != 0 {
			sc.next.Store(t1.Add(min(sc.resync, time.Second)).UnixNano())
		}
		return fmt.Errorf("reading the store's clock: %w", driver.Unavailable(err))
	}
	if !driver.InRange(st) {
		// A store that tells an impossible time has failed; its time is
		// not the caller's bad input.
		err := fmt.Errorf("%w: the store's clock reads %s, outside 1970-01-01 to 2150-01-01 UTC", ErrUnavailable, st.UTC().Format(time.RFC3339))
		if sc.next.Load() != 0 {
			sc.next.Store(t1.Add(min(sc.resync, time.Second)).UnixNano())
		}
		return fmt.Errorf("reading the store's clock: %w", err)
	}
	mid := t0.Add(t1.Sub(t0) / 2)
	sc.offset.Store(int64(truncMicro(st.Sub(mid))))
	sc.next.Store(t1.Add(sc.resync).UnixNano())
	return nil
}
