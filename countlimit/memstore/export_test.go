package memstore

import (
	"runtime"
	"slices"
	"time"

	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// SweepSlice is sweepSlice, for the tests of the janitor's slices.
const SweepSlice = sweepSlice

// ExpiryGrace is expiryGrace, as a duration.
const ExpiryGrace = time.Duration(expiryGrace) * time.Microsecond

// Elapse moves s's monotonic clock, which only the janitor's deadlines
// follow, d ahead. Call it while nothing else uses s.
func Elapse(s *Store, d time.Duration) { s.start = s.start.Add(-d) }

// Sweep runs one sweep now, as the janitor does, and reports how many
// shard maps it replaced with fresh ones.
func Sweep(s *Store) (rebuilt int) { return s.sweep(runtime.Gosched) }

// SweepPausing is Sweep, which runs f between the sweep's slices, with the
// shard's lock let go.
func SweepPausing(s *Store, f func()) (rebuilt int) {
	return s.sweep(func() { f(); runtime.Gosched() })
}

// Peak reports the sum of the shards' peaks: the ids their maps are sized
// for.
func Peak(s *Store) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.peak
		sh.mu.Unlock()
	}
	return n
}

// PerShard reports the most counters one shard holds; 0 for no cap.
func PerShard(s *Store) int { return s.perShard }

// BytesPerShard reports the most bytes one shard accounts; 0 for no bound.
func BytesPerShard(s *Store) int64 { return s.perBytes }

// ShardLocked reports whether the lock of the shard of (ut, id) is held.
func ShardLocked(s *Store, ut, id string) bool {
	sh := s.shard(s.hash(ut, id))
	if sh.mu.TryLock() {
		sh.mu.Unlock()
		return false
	}
	return true
}

// MayHaveExpired reports whether the shard of (ut, id) may hold a counter
// that has expired, as a full shard judges before it looks for one to
// drop.
func MayHaveExpired(s *Store, ut, id string) bool {
	sh := s.shard(s.hash(ut, id))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return s.mono() >= sh.soonest
}

// NextLook reports when, in the store's monotonic microseconds, the shard
// of (ut, id) next looks for expired counters when it is full: a look in
// vain moves it on.
func NextLook(s *Store, ut, id string) int64 {
	sh := s.shard(s.hash(ut, id))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.soonest
}

// SameShard reports whether the counters of ut for two ids live in one
// shard.
func SameShard(s *Store, ut, a, b string) bool {
	return s.shard(s.hash(ut, a)) == s.shard(s.hash(ut, b))
}

// KeyForTest returns what s keeps of (ut, id), in the model's terms.
func KeyForTest(s *Store, ut, id string) model.Key {
	h := s.hash(ut, id)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.get(h, ut, id)
	if e == nil {
		return model.Key{}
	}
	k := model.Key{Count: e.count, Begin: e.begin, End: e.end, Log: slices.Clone(e.events), Denied: e.denied, Blocked: e.blocked}
	if e.end == forever {
		k.End = model.Forever
	}
	if e.smooth() {
		k.Begin, k.TAT = 0, e.end
	}
	if e.leases != nil {
		k.Leases = map[string]int64{}
		for _, l := range e.leases.held {
			k.Leases[l.token] = l.expires
		}
	}
	return k
}

// SeedForTest makes s keep k for (ut, id), replacing what it kept.
func SeedForTest(s *Store, ut, id string, k model.Key) {
	h := s.hash(ut, id)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.remove(h, ut, id)
	if keystate.Empty(&k) {
		return
	}
	e := newEntry(ut, id, 0)
	e.count, e.begin, e.end, e.denied, e.blocked = k.Count, k.Begin, k.End, k.Denied, k.Blocked
	if k.End == model.Forever {
		e.end = forever
	}
	e.events = slices.Clone(k.Log)
	if k.TAT > 0 {
		e.begin, e.end = smoothBegin(k.TAT+smoothSlack), k.TAT
	}
	for t, x := range k.Leases {
		if e.leases == nil {
			e.leases = &leaseSet{}
		}
		e.leases.held = append(e.leases.held, lease{token: t, expires: x})
	}
	sh.add(h, e)
	s.touch(sh, e, 0)
}

// DeadlineForTest returns when the janitor may drop the counter of (ut,
// id), on the store's monotonic scale; 0 when it holds none.
func DeadlineForTest(s *Store, ut, id string) time.Duration {
	h := s.hash(ut, id)
	sh := s.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.get(h, ut, id); e != nil {
		return time.Duration(e.expires)
	}
	return 0
}
