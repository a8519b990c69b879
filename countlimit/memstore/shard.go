// The shards: where counters live, what they take of the heap, how a full
// shard makes room, and the janitor that sweeps expired counters out.

package memstore

import (
	"runtime"
	"sync"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// sweepSlice is how many counters the janitor looks at, or moves into a
// fresh map, per hold of a shard's lock (finishing the chain it is at):
// few enough that a hold stays short (each counter costs a cache miss or
// two), so that no check waits long behind a sweep; docs/benchmarks.md has
// the measured holds. A call that finds its shard full looks at no more.
const sweepSlice = 512

// lookAgain is how long a full shard that looked for expired counters in
// vain waits before it looks again, unless a sweep or a shorter-lived
// counter says sooner: refusing a flood of new ids must not cost a look
// each.
const lookAgain = int64(time.Second)

// shrinkMin is the fewest counters a shard's map must have held before a
// sweep rebuilds it: below that the buckets cost too little to bother.
const shrinkMin = 1024

type shard struct {
	mu sync.Mutex
	// m maps the hash of a counter's use type and id (Store.hash) to a
	// chain of counters linked by entry.next: that counter, and any other
	// whose 64-bit hash is the same. The hash that picked the shard is the
	// key, so a check hashes each of its counters once.
	m map[uint64]*entry
	// old is a map a sweep is moving into m, a slice at a time, to give its
	// buckets back; nil otherwise. A chain is in one of the two, never both.
	old map[uint64]*entry
	// n is how many counters m and old hold.
	n int
	// bytes is what they take on the heap (the sum of entry.size).
	bytes int64
	// peak is the most chains m has held: what its buckets are sized for.
	peak int
	// oldPeak is old's peak while a sweep moves its chains; 0 otherwise.
	oldPeak int
	// No counter expires before soonest (in Store.mono's terms), or a full
	// shard looked for expired ones in vain and waits until soonest to look
	// again. A full shard with soonest ahead refuses at once.
	soonest int64
	// low is the soonest expiry set since the running sweep began, so the
	// sweep's own lower bound misses no counter it did not see.
	low int64
	_   [56]byte // two cache lines a shard: neighbouring shards' locks never share one
}

// used is what the shard accounts on the heap: its counters, and its maps'
// slots for the most chains they have held (a Go map never shrinks).
func (sh *shard) used() int64 { return sh.bytes + int64(sh.peak+sh.oldPeak)*mapSlotBytes }

// holds reports whether a chain of h is in sh, so a new counter of h needs
// no new slot in the map.
func (sh *shard) holds(h uint64) bool {
	if _, ok := sh.m[h]; ok {
		return true
	}
	_, ok := sh.old[h]
	return ok
}

// resize accounts e's heap again, after its log or leases changed.
func (sh *shard) resize(e *entry) {
	n := e.heap()
	sh.bytes += n - e.size
	e.size = n
}

// get returns the counter of (ut, id), whose hash is h, or nil.
func (sh *shard) get(h uint64, ut string, id string) *entry {
	e := find(sh.m[h], ut, id)
	if e == nil && sh.old != nil {
		e = find(sh.old[h], ut, id)
	}
	return e
}

func find(e *entry, ut string, id string) *entry {
	for ; e != nil && (e.useType != ut || e.id != id); e = e.next {
	}
	return e
}

// add puts a new counter, whose key hashes to h, at the head of its chain.
func (sh *shard) add(h uint64, e *entry) {
	m := sh.m
	if _, ok := sh.old[h]; ok {
		m = sh.old // a chain stays in the map it is in
	}
	e.next = m[h]
	m[h] = e
	sh.n++
	e.size = e.heap()
	sh.bytes += e.size
	sh.peak = max(sh.peak, len(sh.m))
}

// remove drops the counter of (ut, id), whose hash is h, if it is held.
func (sh *shard) remove(h uint64, ut string, id string) {
	for _, m := range [...]map[uint64]*entry{sh.m, sh.old} {
		head := m[h]
		if head == nil {
			continue
		}
		if head.useType == ut && head.id == id {
			if head.next == nil {
				delete(m, h)
			} else {
				m[h] = head.next
			}
			sh.n--
			sh.bytes -= head.size
			return
		}
		for p := head; p.next != nil; p = p.next {
			if e := p.next; e.useType == ut && e.id == id {
				p.next = e.next
				sh.n--
				sh.bytes -= e.size
				return
			}
		}
	}
}

// prune drops the expired counters of the chain of h in m, and moves what
// is left to the map to when it is not nil. It returns how many counters
// it looked at and the soonest expiry it kept.
func (sh *shard) prune(m, to map[uint64]*entry, h uint64, mono int64) (seen int, low int64) {
	low = forever
	head := m[h]
	kept, tail := head, &head
	for e := head; e != nil; e = e.next {
		seen++
		if e.expires <= mono {
			sh.n--
			sh.bytes -= e.size
			continue
		}
		*tail, tail = e, &e.next
		low = min(low, e.expires)
	}
	*tail = nil
	switch {
	case head == nil:
		delete(m, h)
	case to != nil:
		to[h] = head
		delete(m, h)
	case head != kept:
		m[h] = head
	}
	return seen, low
}

// makeRoom reports whether each of the shards held has room for what r's
// writes add to it (see need). When one has none and r is allowed, it
// drops expired counters there to make some (see reclaim), and fails with
// ErrFull if that is not enough; a denial that finds no room in one of them
// is answered, and its new counters in any not kept. The entries and views
// of a shard's slots are looked up again after a reclaim there, which may
// have dropped an expired counter of r's.
func (s *Store) makeRoom(held []*shard, r *driver.Request, slots []slot, ok bool, n, now int64) (room bool, err error) {
	for _, sh := range held {
		bytes, entries := s.need(sh, r, slots, ok, n)
		full := s.full(sh, bytes, entries)
		if full == nil {
			continue
		}
		if !ok {
			return false, nil
		}
		if !s.reclaim(sh, bytes, entries) {
			return false, full
		}
		for i := range r.Checks {
			if c, sl := &r.Checks[i], &slots[i]; sl.sh == sh {
				sl.e = sh.get(sl.h, c.UseType, r.ID)
				look(&sl.v, sl.e, c, now)
			}
		}
		bytes, entries = s.need(sh, r, slots, ok, n)
		if full := s.full(sh, bytes, entries); full != nil {
			return false, full
		}
	}
	return true, nil
}

// need returns the bytes and the counters r's writes would add to sh: a
// counter for each of its checks in sh that has none, with a slot of sh's
// map for each whose chain is new when the map must grow, and, when r is
// allowed, the growth of each sliding log whose array is too short; a
// denial writes only the checks that deny (see apply), and logs nothing.
// write grows a log just as need reckons (logCap).
func (s *Store) need(sh *shard, r *driver.Request, slots []slot, ok bool, n int64) (bytes int64, entries int) {
	chains := 0 // new ones
	for i := range r.Checks {
		c, sl := &r.Checks[i], &slots[i]
		if sl.sh != sh || !ok && sl.v.fits(c, n) {
			continue
		}
		if sl.e == nil {
			entries++
			if !sh.holds(sl.h) {
				chains++
			}
			bytes += newEntryBytes(c.UseType, r.ID)
			if c.Span > 0 && ok {
				bytes += allocSize(logCap(0, int(n)) * eventSize)
			}
			continue
		}
		if old := cap(sl.e.events); c.Span > 0 && ok && int(sl.v.used+n) > old {
			bytes += allocSize(logCap(old, int(sl.v.used+n))*eventSize) - allocSize(old*eventSize)
		}
	}
	bytes += int64(max(0, len(sh.m)+chains-sh.peak)) * mapSlotBytes
	return bytes, entries
}

// full returns the error of a call that would add bytes and entries to sh,
// or nil when they fit.
func (s *Store) full(sh *shard, bytes int64, entries int) error {
	switch {
	case s.perShard > 0 && sh.n+entries > s.perShard:
		return s.fullEntries
	case s.perBytes > 0 && bytes > 0 && sh.used()+bytes > s.perBytes:
		return s.fullBytes
	}
	return nil
}

// reclaim makes room for bytes and entries more in a full shard by dropping
// expired counters, looking at about sweepSlice, and reports whether they
// fit now.
func (s *Store) reclaim(sh *shard, bytes int64, entries int) bool {
	mono := s.mono()
	if mono < sh.soonest {
		return false
	}
	seen, low := 0, int64(forever)
	for _, m := range [...]map[uint64]*entry{sh.old, sh.m} {
		for h := range m {
			if seen >= sweepSlice {
				if s.full(sh, bytes, entries) != nil {
					sh.soonest = mono + lookAgain
					return false
				}
				return true
			}
			k, l := sh.prune(m, nil, h, mono)
			seen += k
			low = min(low, l)
		}
	}
	sh.soonest = low // it saw every counter
	return s.full(sh, bytes, entries) == nil
}

func (s *Store) janitor(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep(runtime.Gosched)
		}
	}
}

// sweep drops every entry whose window and penalty are over, and rebuilds
// the maps of shards left with a quarter or less of their peak. It calls
// yield between slices, with the shard's lock let go (the janitor's is
// runtime.Gosched, to let the checks that waited take the lock), and
// reports how many shard maps it rebuilt.
func (s *Store) sweep(yield func()) (rebuilt int) {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	for i := range s.shards {
		if s.sweepShard(&s.shards[i], yield) {
			rebuilt++
		}
	}
	return rebuilt
}

func (s *Store) sweepShard(sh *shard, yield func()) (rebuilt bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.low = forever
	low := s.drain(sh, sh.m, nil, yield)
	if sh.peak >= shrinkMin && len(sh.m) <= sh.peak/4 {
		rebuilt = true
		sh.old, sh.m = sh.m, make(map[uint64]*entry, len(sh.m))
		sh.oldPeak, sh.peak = sh.peak, len(sh.old)
		low = min(low, s.drain(sh, sh.old, sh.m, yield))
		sh.old, sh.oldPeak = nil, 0
	}
	sh.soonest = min(low, sh.low)
	return rebuilt
}

// drain walks m, about sweepSlice counters per hold of sh's lock (a chain
// is done whole), drops the expired ones and, when to is not nil, moves
// the others into it. It returns the soonest expiry it kept. sh is locked
// on entry and on return.
//
// The lock is let go only at the end of an iteration, so the next key and
// chain are read under it and are never stale. A Go map may change between
// the steps of a range loop: a key deleted meanwhile is not produced, and
// one added meanwhile may or may not be; checks add new keys to sh.m only
// (a new counter joins its chain where the chain is), so while m is
// sh.old, a chain is always in exactly one of the two.
func (s *Store) drain(sh *shard, m, to map[uint64]*entry, yield func()) int64 {
	mono, low, seen := s.mono(), int64(forever), 0
	for h := range m {
		k, l := sh.prune(m, to, h, mono)
		low = min(low, l)
		if seen += k; seen >= sweepSlice {
			seen = 0
			sh.mu.Unlock()
			yield()
			sh.mu.Lock()
			mono = s.mono()
		}
	}
	return low
}
