package memstore

import (
	"slices"
	"time"

	"github.com/countlimit/countlimit/countlimit"
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
// peek, release or extend. Its twins are pgstore's lease statements and
// redisstore's lease.lua; storetest's Lease cases pin all three. A key's
// leases live in its entry beside the count, and neither touches the other.
func (s *Store) leaseOp(r *countlimit.Request, h uint64, sh *shard) error {
	c := &r.Checks[0]
	now := r.Now.UnixMicro()
	sh.mu.Lock()
	e := sh.get(h, c.UseType, r.ID)
	var held []lease // e's live leases
	blocked := false
	if e != nil {
		if e.leases != nil {
			held = slices.DeleteFunc(e.leases.held, func(l lease) bool { return l.expires <= now })
			keep(e, held) // DeleteFunc cleared the tail it cut
		}
		blocked = e.blocked > now
	}
	used := int64(len(held))
	fits := !blocked && 1 <= c.Limit-used
	allowed := false
	switch r.Op {
	case countlimit.OpPeek:
		allowed = fits
	case countlimit.OpAcquire:
		allowed = fits
		if e == nil {
			room := s.perShard <= 0 || sh.n+1 <= s.perShard || (fits && s.reclaim(sh, 1))
			if !room && fits {
				sh.mu.Unlock()
				return s.errFull
			}
			if room {
				e = &entry{useType: c.UseType, id: r.ID, begin: now, end: now} // no counted window
				sh.add(h, e)
			}
		}
		if e == nil {
			break // a denial that found the shard full keeps nothing
		}
		if fits {
			held = append(held, lease{token: r.Lease, expires: now + c.TTL.Microseconds()})
		} else if !blocked && c.Block > 0 {
			e.blocked = now + c.Block.Microseconds()
		}
		keep(e, held)
		s.touch(sh, e, now)
	case countlimit.OpRelease, countlimit.OpExtend:
		i := slices.IndexFunc(held, func(l lease) bool { return l.token == r.Lease })
		if i < 0 {
			break // released before, expired, or never taken
		}
		allowed = true
		if r.Op == countlimit.OpRelease {
			held = slices.Delete(held, i, i+1)
		} else {
			held[i].expires = now + c.TTL.Microseconds()
		}
		keep(e, held)
		if r.Op == countlimit.OpExtend {
			s.touch(sh, e, now)
		}
	}
	st := countlimit.State{Allowed: allowed, Used: int64(len(held))}
	if len(held) > 0 {
		first, last := leaseBounds(held)
		st.Begin, st.End = time.UnixMicro(first), time.UnixMicro(last)
	}
	if e != nil {
		if e.blocked > now {
			st.BlockedUntil = time.UnixMicro(e.blocked)
		}
	}
	sh.mu.Unlock()
	c.State = st
	return nil
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
