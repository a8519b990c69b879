// Package memstore is the in-process countlimit.Store: sharded maps behind
// mutexes, with a janitor that drops expired state. It is the embedded
// default of the countlimit command and the store for tests and single-process
// services. State is lost when the process exits; so are its leases: a
// lease string (countlimit.Lease.String) taken on a memstore can be released
// only in the process that holds that store, by any Limiter over it.
//
// All counters of one id live in one shard, so a multi-rule check takes one
// lock. Checking an existing key allocates nothing.
//
// # Memory
//
// A counter costs about 180 bytes with its key (a Sliding window adds 8
// bytes per logged event, a Concurrent one about 40 bytes per held slot).
// The store holds at most [DefaultMaxEntries] counters, about 190 MB,
// unless [WithMaxEntries] says otherwise; when it is full, calls that would
// add a counter fail and the counters it holds go on working (see
// WithMaxEntries for why it never evicts a live one).
//
// The janitor drops a counter once its window and penalty are over. It
// sweeps a shard [SweepSlice] counters at a time, letting go of the shard's
// lock between slices, so a check never waits for a whole shard to be
// swept. Go maps never give memory back, so when a sweep leaves a shard
// with a quarter or less of the most ids it has held, the janitor moves
// their counters into a fresh map, again a slice at a time, and the old one
// is freed.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/wire"
)

var _ countlimit.Store = (*Store)(nil)

const (
	// DefaultJanitorInterval is how often the janitor sweeps expired state.
	DefaultJanitorInterval = time.Minute
	// DefaultMaxEntries is how many counters a Store holds unless
	// WithMaxEntries says otherwise: about 190 MB, so that the countlimit
	// service, which keeps its counters here by default, cannot be made to
	// exhaust its memory by a flood of new ids.
	DefaultMaxEntries = 1 << 20
	// SweepSlice is how many counters the janitor looks at, or moves into
	// a fresh map, per hold of a shard's lock (finishing the id it is at,
	// whose counters go together): a few hundred microseconds at most (each
	// costs a cache miss or two), so that no check waits long behind a
	// sweep. A call that finds its shard full looks at no more.
	SweepSlice = 512
)

// lookAgain is how long a full shard that looked for expired counters in
// vain waits before it looks again, unless a sweep or a shorter-lived
// counter says sooner: refusing a flood of new ids must not cost a look
// each.
const lookAgain = int64(time.Second)

// shrinkMin is the fewest counters a shard's map must have held before a
// sweep rebuilds it: below that the buckets cost too little to bother.
const shrinkMin = 1024

// ErrFull is in the error of a call that would add a counter to a store
// that has no room for it (see WithMaxEntries), along with
// countlimit.ErrUnavailable: errors.Is holds for both.
var ErrFull = errors.New("memstore: full")

// Store keeps counters in memory. It is safe for concurrent use. Create it
// with New and stop its janitor with Close.
type Store struct {
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	perShard int       // the most counters one shard holds; 0 for no cap
	errFull  error     // what a call that finds its shard full fails with
	start    time.Time // origin of the monotonic expiry deadlines

	sweepMu  sync.Mutex   // one sweep at a time
	pause    func()       // tests: run between a sweep's slices, lock released
	rebuilds atomic.Int64 // shard maps replaced by fresh ones
	looks    atomic.Int64 // full shards' looks for expired counters

	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type shard struct {
	mu sync.Mutex
	// m maps the hash of an id (Store.hash) to a chain of counters linked
	// by entry.next: the id's, one per UseType, and any of another id with
	// the same 64-bit hash. The hash that picked the shard is the key, so a
	// check hashes its id once and no UseType.
	m map[uint64]*entry
	// old is a map a sweep is moving into m, a slice at a time, to give its
	// buckets back; nil otherwise. A chain is in one of the two, never both.
	old map[uint64]*entry
	// n is how many counters m and old hold.
	n int
	// peak is the most chains m has held: what its buckets are sized for.
	peak int
	// No counter expires before soonest (in Store.mono's terms), or a full
	// shard looked for expired ones in vain and waits until soonest to look
	// again. A full shard with soonest ahead refuses at once.
	soonest int64
	// low is the soonest expiry set since the running sweep began, so the
	// sweep's own lower bound misses no counter it did not see.
	low int64
	_   [8]byte // keep neighbouring shards' locks off one cache line
}

// get returns the counter of (ut, id), whose hash is h, or nil.
func (sh *shard) get(h uint64, ut countlimit.UseType, id string) *entry {
	e := find(sh.m[h], ut, id)
	if e == nil && sh.old != nil {
		e = find(sh.old[h], ut, id)
	}
	return e
}

func find(e *entry, ut countlimit.UseType, id string) *entry {
	for ; e != nil && (e.useType != ut || e.id != id); e = e.next {
	}
	return e
}

// add puts a new counter, whose id hashes to h, at the head of its chain.
func (sh *shard) add(h uint64, e *entry) {
	m := sh.m
	if _, ok := sh.old[h]; ok {
		m = sh.old // a chain stays in the map it is in
	}
	e.next = m[h]
	m[h] = e
	sh.n++
	sh.peak = max(sh.peak, len(sh.m))
}

// remove drops the counter of (ut, id), whose hash is h, if it is held.
func (sh *shard) remove(h uint64, ut countlimit.UseType, id string) {
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
			return
		}
		for p := head; p.next != nil; p = p.next {
			if p.next.useType == ut && p.next.id == id {
				p.next = p.next.next
				sh.n--
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

// entry is one (use type, id) counter. Times are Unix microseconds.
type entry struct {
	useType countlimit.UseType
	id      string
	next    *entry // the next counter in the chain of the id's hash
	count   int64
	begin   int64
	end     int64 // forever for lifetime windows
	blocked int64 // 0 when never blocked
	events  []int64
	// leases are the slots held of a Concurrent check (lease.go), kept
	// apart from the count; nil for every other kind, which so pays one
	// pointer for them.
	leases *leaseSet
	// expires is when the janitor may drop the entry, in nanoseconds since
	// Store.start on the monotonic clock: housekeeping follows a relative
	// TTL, as Redis does, and never decides a check.
	expires int64
	// The padding makes an entry 128 bytes, a size class of its own whose
	// objects start on 128-byte boundaries: two counters never share a
	// cache line or its prefetched pair. At 112 bytes, counters made one
	// after another sat side by side, and two goroutines each counting its
	// own id ran at 68-110 ns an Allow instead of 56 (VersusRate, 2026-11-26).
	// It costs 16 bytes a counter: 166 -> 182 in BenchmarkMemory.
	_ [16]byte
}

const forever = math.MaxInt64

type config struct {
	shards   int
	interval time.Duration
	max      int
}

// Option configures a Store.
type Option func(*config)

// WithShards sets the number of shards, rounded up to a power of two
// (default 64). More shards mean less lock contention between ids.
func WithShards(n int) Option { return func(c *config) { c.shards = n } }

// WithJanitorInterval sets how often expired state is dropped (default
// DefaultJanitorInterval); 0 or less turns the janitor off.
func WithJanitorInterval(d time.Duration) Option { return func(c *config) { c.interval = d } }

// WithMaxEntries caps how many counters the store holds (default
// DefaultMaxEntries); 0 or less removes the cap. A counter is one (UseType,
// id) pair, whatever its window.
//
// The cap is kept per shard: each of the store's shards holds at most n
// divided by the number of shards, rounded up. Ids go to shards by a hash
// with a random seed per Store, so they spread evenly and no one can pick
// ids that pile into one shard; the store as a whole takes about n.
//
// When a call would add a counter to a full shard, the shard first drops
// counters whose window and penalty are over, looking at about SweepSlice
// of them (the janitor's sweeps drop the rest); a shard that knows
// none can have expired, or looked in vain in the last second, does not
// look. If there is still no room, the call fails with an error that wraps both ErrFull and
// countlimit.ErrUnavailable, so the caller's failure policy decides
// (httplimit answers 503, or lets the request through under FailOpen).
// Counters the store already holds go on counting, denying, refunding and
// resetting as before. A call that is denied anyway is answered with its
// denial rather than an error, so a fail-open policy never turns it into a
// pass; its new counters are not kept, so it sets no penalty and tallies no
// denial for them.
//
// A full store never evicts a live counter, least recently used or not:
// whoever can fill it with new ids could then wipe out another id's count
// (a password-reset limit, a penalty box) and start it over. Refusing new
// ids keeps every count right, and lasts only until counters expire.
func WithMaxEntries(n int) Option { return func(c *config) { c.max = n } }

// New returns an empty Store and starts its janitor.
func New(opts ...Option) *Store {
	cfg := config{shards: 64, interval: DefaultJanitorInterval, max: DefaultMaxEntries}
	for _, o := range opts {
		o(&cfg)
	}
	n := 1
	for n < cfg.shards {
		n <<= 1
	}
	s := &Store{
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		seed:   maphash.MakeSeed(),
		start:  time.Now(),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if cfg.max > 0 {
		s.perShard = (cfg.max + n - 1) / n
		s.errFull = fmt.Errorf("%w: no room for a new counter: its shard holds %d, its share of WithMaxEntries(%d) over %d shards; counters already held still work",
			ErrFull, s.perShard, cfg.max, n)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[uint64]*entry)
		s.shards[i].soonest = forever
		s.shards[i].low = forever
	}
	if cfg.interval > 0 {
		go s.janitor(cfg.interval)
	} else {
		close(s.done)
	}
	return s
}

var errClosed = errors.New("memstore: store is closed")

// Close stops the janitor. Calls made after Close fail with
// countlimit.ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
	})
	<-s.done
	return nil
}

// Len reports how many counters the store holds, expired ones the janitor
// has not dropped yet included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Do implements countlimit.Store. A request that would add a counter to a
// full shard fails the call (see WithMaxEntries), after the requests before
// it in reqs have been carried out.
func (s *Store) Do(ctx context.Context, reqs []*countlimit.Request) error {
	if err := ctx.Err(); err != nil {
		return countlimit.Unavailable(err)
	}
	if s.closed.Load() {
		return countlimit.Unavailable(errClosed)
	}
	for _, r := range reqs {
		if err := s.apply(r); err != nil {
			return countlimit.Unavailable(err)
		}
	}
	return nil
}

// hash is the hash of an id: its low bits pick the shard, and the whole
// is the key of the id's chain in the shard's map.
func (s *Store) hash(id string) uint64 { return maphash.String(s.seed, id) }

func (s *Store) shard(h uint64) *shard { return &s.shards[h&s.mask] }

// mono is the time since the store started on the monotonic clock, the
// scale of entry.expires.
func (s *Store) mono() int64 { return int64(time.Since(s.start)) }

// view is a check's current window as an entry shows it at now.
type view struct {
	used       int64
	begin, end int64
	live       int // sliding: index of the oldest event still in the window
	blocked    bool
}

// look sets v to the check's current window as e shows it at now. It
// writes v in place, as write does: returned by value, views were copied
// through the stack several times a check, about 20 ns of an Allow.
func look(v *view, e *entry, c *countlimit.Check, now int64) {
	*v = view{}
	span := c.Span.Microseconds()
	if e != nil {
		v.blocked = e.blocked > now
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
			v.used, v.begin, v.end = e.count, e.begin, e.end
			return
		}
	}
	if span > 0 {
		return // its log is a sliding check's window: c.Begin and c.End mean nothing
	}
	v.begin, v.end = c.Begin.UnixMicro(), wire.Micros(c.End, forever)
}

func (v *view) fits(c *countlimit.Check, n int64) bool { return !v.blocked && n <= c.Limit-v.used }

// slot is one check of a request while apply works on it: its entry and
// view, and what its State needs from the entry, read under the shard's
// lock so the State is built after it is let go.
type slot struct {
	e       *entry
	v       view
	blocked int64 // the entry's penalty end; 0 for none
	freeAt  int64 // a sliding denial's State.FreeAt, when free
	free    bool
}

// inline is how many checks a request may have before apply's scratch
// space leaves the stack.
const inline = 2

// apply carries out one request. The checks of a request have distinct
// UseTypes (the Limiter makes sure), so each check's entry is looked up
// once: the shard's lock is held for the lookups and the counter updates,
// and the States are built after it is let go.
//
// Twins: countlimit_apply (migrations/00002_apply_locking.sql) and
// redisstore's apply.lua make the same decision, each atomic in its own
// store, and queries/fast.sql and redisstore's fast.lua again for one
// rule that is not sliding: change one, change them all. The contract is countlimit.Store's;
// storetest.Run, in each store's TestConformance, holds them to it, the
// corners in RollingStartsAtFirstCountedEvent and LateClockReadJoinsWindow
// (fresh or current window), Sliding, AllowNSliding and SlidingOutOfOrder
// (the log), Refund and RefundSliding, AllowAllHourAndDay, AllowAllBlock and
// ConcurrentAllowAllNoDeadlock (all or nothing), PenaltyOutlivesWindow,
// LimitChangedMidWindow and WindowKindChanged.
func (s *Store) apply(r *countlimit.Request) error {
	h := s.hash(r.ID)
	sh := s.shard(h)
	if r.Op == countlimit.OpReset {
		sh.mu.Lock()
		for i := range r.Checks {
			sh.remove(h, r.Checks[i].UseType, r.ID)
		}
		sh.mu.Unlock()
		return nil
	}
	if r.OnLeases() {
		return s.leaseOp(r, h, sh)
	}
	now := r.Now.UnixMicro()
	n := r.N
	if r.Op != countlimit.OpAllow {
		n = 1
	}
	var buf [inline]slot
	slots := buf[:len(r.Checks):len(r.Checks)]
	if len(r.Checks) > inline {
		slots = make([]slot, len(r.Checks))
	}

	sh.mu.Lock()
	ok := true
	for i := range r.Checks {
		c, sl := &r.Checks[i], &slots[i]
		sl.e = sh.get(h, c.UseType, r.ID)
		if r.Op == countlimit.OpRefund && sl.e != nil {
			look(&sl.v, sl.e, c, now)
			s.refund(sl.e, c, &sl.v, r.N)
		}
		look(&sl.v, sl.e, c, now)
		ok = ok && sl.v.fits(c, n)
	}
	room := true // for the counters this request adds
	if r.Op == countlimit.OpAllow && s.perShard > 0 && sh.n+len(r.Checks) > s.perShard {
		need := 0
		for i := range slots {
			if slots[i].e == nil {
				need++
			}
		}
		room = sh.n+need <= s.perShard || (ok && s.reclaim(sh, need))
		if !room && ok {
			sh.mu.Unlock()
			return s.errFull
		}
		for i := range r.Checks { // reclaim may have dropped an expired one
			c, sl := &r.Checks[i], &slots[i]
			sl.e = sh.get(h, c.UseType, r.ID)
			look(&sl.v, sl.e, c, now)
		}
	}
	for i := range r.Checks {
		c, sl := &r.Checks[i], &slots[i]
		if r.Op == countlimit.OpAllow && (ok || !sl.v.fits(c, n)) && (sl.e != nil || room) {
			if sl.e == nil {
				sl.e = &entry{useType: c.UseType, id: r.ID, begin: now, end: now} // an empty window until counted
				sh.add(h, sl.e)
			}
			s.write(sh, sl.e, c, &sl.v, ok, n, now)
		}
		if e := sl.e; e != nil {
			sl.blocked = e.blocked
			if c.Span > 0 && !ok && n <= c.Limit && sl.v.used+n > c.Limit {
				sl.freeAt, sl.free = e.events[sl.v.live+int(sl.v.used+n-c.Limit)-1], true
			}
		}
	}
	sh.mu.Unlock()

	for i := range r.Checks {
		state(&r.Checks[i], &slots[i], ok, now)
	}
	return nil
}

// reclaim makes room for need more counters in a full shard by dropping
// expired ones, looking at about SweepSlice, and reports whether they fit
// now.
func (s *Store) reclaim(sh *shard, need int) bool {
	mono := s.mono()
	if mono < sh.soonest {
		return false
	}
	s.looks.Add(1)
	seen, low := 0, int64(forever)
	for _, m := range [...]map[uint64]*entry{sh.old, sh.m} {
		for h := range m {
			if seen >= SweepSlice {
				if sh.n+need > s.perShard {
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
	return sh.n+need <= s.perShard
}

// write counts n (allowed) or records the denial of an entry, and updates
// its view v.
func (s *Store) write(sh *shard, e *entry, c *countlimit.Check, v *view, allowed bool, n, now int64) {
	deadline := max(e.end, e.blocked)
	switch span := c.Span.Microseconds(); {
	case !allowed:
		// memstore keeps no denial tally: only the SQL audit reads one.
		if !v.blocked && c.Block > 0 {
			e.blocked = now + c.Block.Microseconds()
			v.blocked = true
		}
	case span > 0:
		e.events = insertSorted(append(e.events[:0], e.events[v.live:]...), now, int(n))
		e.count = int64(len(e.events))
		e.begin, e.end = e.events[0], e.events[len(e.events)-1]+span
		v.used, v.begin, v.end, v.live = e.count, e.begin, e.end, 0
	default:
		e.count = v.used + n
		e.begin, e.end = v.begin, v.end
		e.events = e.events[:0]
		v.used += n
	}
	if e.expires == 0 || max(e.end, e.blocked) != deadline {
		s.touch(sh, e, now)
	}
}

func (s *Store) refund(e *entry, c *countlimit.Check, v *view, n int64) {
	if span := c.Span.Microseconds(); span > 0 {
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

// touch sets the janitor's deadline from the entry's window and penalty. A
// write calls it only when it moved the end of either, or the entry is new
// (expires 0): a check in a current window reads no clock but the
// Limiter's, and the deadline set when the window opened counts the same
// time down. A Limiter clock stepped against the monotonic one since then
// is followed at the next write that moves the window or the penalty.
func (s *Store) touch(sh *shard, e *entry, now int64) {
	mono := s.mono()
	ttl := max(e.end, e.blocked, e.leases.last()) - now // µs
	if ttl >= (forever-mono)/int64(time.Microsecond) {
		e.expires = forever // lifetime, or beyond what the clock can hold
		return
	}
	e.expires = mono + ttl*int64(time.Microsecond)
	sh.soonest = min(sh.soonest, e.expires)
	sh.low = min(sh.low, e.expires)
}

// state writes c.State from its slot, after the lock is let go.
func state(c *countlimit.Check, sl *slot, allowed bool, now int64) {
	st, v := &c.State, &sl.v
	*st = countlimit.State{Allowed: allowed, Used: v.used}
	if c.Span == 0 || v.used > 0 {
		st.Begin, st.End = time.UnixMicro(v.begin), wire.Time(v.end, forever)
	}
	if sl.e != nil && sl.blocked > now {
		st.BlockedUntil = time.UnixMicro(sl.blocked)
	}
	if sl.free {
		st.FreeAt = time.UnixMicro(sl.freeAt)
	}
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
			s.sweep()
		}
	}
}

// sweep drops every entry whose window and penalty are over, and rebuilds
// the maps of shards left with a quarter or less of their peak.
func (s *Store) sweep() {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	for i := range s.shards {
		s.sweepShard(&s.shards[i])
	}
}

func (s *Store) sweepShard(sh *shard) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.low = forever
	low := s.drain(sh, sh.m, nil)
	if sh.peak >= shrinkMin && len(sh.m) <= sh.peak/4 {
		s.rebuilds.Add(1)
		sh.old, sh.m = sh.m, make(map[uint64]*entry, len(sh.m))
		sh.peak = len(sh.old)
		low = min(low, s.drain(sh, sh.old, sh.m))
		sh.old = nil
	}
	sh.soonest = min(low, sh.low)
}

// drain walks m, about SweepSlice counters per hold of sh's lock (a chain
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
func (s *Store) drain(sh *shard, m, to map[uint64]*entry) int64 {
	mono, low, seen := s.mono(), int64(forever), 0
	for h := range m {
		k, l := sh.prune(m, to, h, mono)
		low = min(low, l)
		if seen += k; seen >= SweepSlice {
			seen = 0
			sh.mu.Unlock()
			if s.pause != nil {
				s.pause()
			}
			runtime.Gosched() // let the checks that waited take the lock
			sh.mu.Lock()
			mono = s.mono()
		}
	}
	return low
}
