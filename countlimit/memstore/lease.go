package memstore

import (
	"slices"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// leaseSet holds the leases of a key's Concurrent check, never empty: an
// entry whose last lease goes drops its set.
type leaseSet struct{ held []lease }

// last returns the latest expiry of a lease in ls, or 0 for a nil ls.
func (ls *leaseSet) last() int64 {
	if ls == nil {
		return 0
	}
	_, last := leaseBounds(ls.held)
	return last
}

// lease is one held slot of a Concurrent check: its token and when it
// expires, in Unix microseconds.
type lease struct {
	token   string
	expires int64
}

// leaseOp carries out a request whose one check is Concurrent: acquire,
// peek, release or extend: a copy of model.Apply's leases, as pgstore's
// lease statements and redisstore's lease.lua are (docs/ARCHITECTURE.md
// lists every copy); storetest's Lease cases pin all three. A key's
// leases live in its entry beside the count, and neither touches the other.
func (s *Store) leaseOp(r *driver.Request, h uint64, sh *shard) error {
	sh.mu.Lock()
	st, err := s.leaseLocked(r, h, sh, true)
	sh.mu.Unlock()
	if err != nil {
		return err
	}
	r.Checks[0].State = st
	return nil
}

// leaseLocked is leaseOp with sh locked. An Acquire that needs more room
// than sh has drops expired counters when mayReclaim, and starts over: the
// key's own counter may have been one.
func (s *Store) leaseLocked(r *driver.Request, h uint64, sh *shard, mayReclaim bool) (driver.State, error) {
	c := &r.Checks[0]
	now := r.Now.UnixMicro()
	e := sh.get(h, c.UseType, r.ID)
	var held []lease // e's live leases
	blocked := false
	if e != nil {
		if e.leases != nil {
			held = slices.DeleteFunc(e.leases.held, func(l lease) bool { return l.expires <= now })
			keep(e, held) // DeleteFunc cleared the tail it cut
			sh.resize(e)
			if e.leases == nil {
				held = nil // its array went with the set
			}
		}
		blocked = e.blocked > now
	}
	used := int64(len(held))
	fits := !blocked && 1 <= c.Limit-used
	allowed := false
	switch r.Op {
	case driver.OpPeek:
		allowed = fits
	case driver.OpAcquire:
		allowed = fits
		bytes, entries := leaseNeed(sh, h, r, e, held, fits)
		if full := s.full(sh, bytes, entries); full != nil {
			switch {
			case fits && mayReclaim:
				s.reclaim(sh, bytes, entries)
				return s.leaseLocked(r, h, sh, false)
			case fits:
				return driver.State{}, full
			case e == nil:
				return driver.State{}, nil // a denial that found the shard full keeps nothing
			}
		}
		if e == nil {
			e = newEntry(c.UseType, r.ID, now) // no counted window
			sh.add(h, e)
		}
		if fits {
			if len(held) == cap(held) {
				grown := make([]lease, len(held), leaseCap(cap(held), len(held)+1))
				copy(grown, held)
				held = grown
			}
			held = append(held, lease{token: r.Lease, expires: now + c.TTL.Microseconds()})
		} else {
			e.denied++
			if !blocked && c.Block > 0 {
				e.blocked = now + c.Block.Microseconds()
			}
		}
		keep(e, held)
		sh.resize(e)
		s.touch(sh, e, now)
	case driver.OpRelease, driver.OpExtend:
		i := slices.IndexFunc(held, func(l lease) bool { return l.token == r.Lease })
		if i < 0 {
			break // released before, expired, or never taken
		}
		allowed = true
		if r.Op == driver.OpRelease {
			held = slices.Delete(held, i, i+1)
		} else {
			held[i].expires = now + c.TTL.Microseconds()
		}
		keep(e, held)
		sh.resize(e)
		if r.Op == driver.OpExtend {
			s.touch(sh, e, now)
		}
	}
	st := driver.State{Allowed: allowed, Used: int64(len(held))}
	if len(held) > 0 {
		first, last := leaseBounds(held)
		st.Begin, st.End = time.UnixMicro(first), time.UnixMicro(last)
	}
	if e != nil {
		if e.blocked > now {
			st.BlockedUntil = time.UnixMicro(e.blocked)
		}
	}
	return st, nil
}

// leaseNeed returns the bytes and the counters an Acquire would add to sh:
// a new counter when the key has none, and when it fits a lease with its
// token, in a set that may have to grow as Acquire grows it.
func leaseNeed(sh *shard, h uint64, r *driver.Request, e *entry, held []lease, fits bool) (bytes int64, entries int) {
	if e == nil {
		entries = 1
		bytes = newEntryBytes(r.Checks[0].UseType, r.ID)
		if !sh.holds(h) && len(sh.m) >= sh.peak {
			bytes += mapSlotBytes
		}
	}
	if fits {
		bytes += allocSize(len(r.Lease))
		if held == nil {
			bytes += leaseSetBytes
		}
		if len(held) == cap(held) {
			bytes += allocSize(leaseCap(cap(held), len(held)+1)*leaseSize) - allocSize(cap(held)*leaseSize)
		}
	}
	return bytes, entries
}

// keep stores held as e's leases, dropping the set when it is empty.
func keep(e *entry, held []lease) {
	switch {
	case len(held) == 0:
		e.leases = nil
	case e.leases == nil:
		e.leases = &leaseSet{held: held}
	default:
		e.leases.held = held
	}
}

// leaseBounds returns the earliest and the latest expiry of leases, which
// must not be empty.
func leaseBounds(leases []lease) (first, last int64) {
	first, last = leases[0].expires, leases[0].expires
	for _, l := range leases[1:] {
		first, last = min(first, l.expires), max(last, l.expires)
	}
	return first, last
}
