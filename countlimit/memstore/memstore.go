// Package memstore is the in-process driver.Store: sharded maps behind
// mutexes, with a janitor that drops expired state. It is the embedded
// default of the countlimit command and the store for tests and single-process
// services. State is lost when the process exits; so are its leases: a
// lease string (countlimit.Lease.String) taken on a memstore can be released
// only in the process that holds that store, by any Limiter over it.
//
// A counter, one (use type, id) pair, lives in the shard that a hash of
// both picks, so the counters of one id spread over the shards as those of
// many ids do, and a check finds its counter at the same cost whether its
// id has one use type or a hundred thousand (use types a caller chooses).
// A check of several rules locks their shards in one fixed order and is
// one atomic step across them. Checking an existing key allocates nothing.
//
// # Memory
//
// The store's counters take at most [DefaultMaxBytes] of the heap, unless
// [WithMaxBytes] says otherwise, whatever their ids: each counter is
// accounted for what it holds, as Go's allocator rounds it (the counter,
// its use type and id, its sliding log and its leases, and its share of the
// shard's map). When the bound is reached, a call that would add a counter,
// or lengthen a sliding log or a set of leases, fails with [ErrFull], and
// the counters the store holds go on working (see WithMaxBytes for why it
// never evicts a live one). The bound is on live counters: Go's collector
// lets the heap grow past what is live before it collects (GOGC, and
// GOMEMLIMIT to cap it).
//
// The janitor drops a counter a second after its window and penalty are
// over (a check whose clock was read just before the end still finds it). It
// sweeps a shard 512 counters at a time, letting go of the shard's
// lock between slices, so a check never waits for a whole shard to be
// swept. Go maps never give memory back, so when a sweep leaves a shard
// with a quarter or less of the most counters it has held, the janitor
// moves them into a fresh map, again a slice at a time, and the old one is
// freed.
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
	"unsafe"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/wire"
)

var _ driver.Store = (*Store)(nil)

const (
	// DefaultJanitorInterval is how often the janitor sweeps expired state.
	DefaultJanitorInterval = time.Minute
	// DefaultMaxBytes is how much of the heap a Store's counters take at
	// most unless WithMaxBytes says otherwise, so that the countlimit
	// service, which keeps its counters here by default, cannot be made to
	// exhaust its memory by a flood of new ids, however long.
	DefaultMaxBytes = 256 << 20
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

// ErrFull is in the error of a call that would add a counter, or lengthen
// a sliding log or a set of leases, in a store that has no room for it
// (see WithMaxBytes and WithMaxEntries), along with
// countlimit.ErrUnavailable: errors.Is holds for both.
var ErrFull = errors.New("memstore: full")

// Store keeps counters in memory. It is safe for concurrent use. Create it
// with New and stop its janitor with Close.
type Store struct {
	shards   []shard
	mask     uint64
	seed     maphash.Seed
	perShard int   // the most counters one shard holds; 0 for no cap
	perBytes int64 // the most bytes one shard accounts (shard.used); 0 for no cap
	// What a call that finds its shard full fails with: of counters, of
	// bytes.
	fullEntries, fullBytes error
	start                  time.Time // origin of the monotonic expiry deadlines

	sweepMu sync.Mutex // one sweep at a time

	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

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

// entry is one (use type, id) counter. Times are Unix microseconds.
type entry struct {
	useType string
	id      string
	next    *entry // the next counter in the chain of its key's hash (a collision)
	count   int64
	// begin and end bound the window of count; end is forever for
	// lifetime windows. A sliding log keeps there its length and bounds
	// as last written. A Smooth check's entry keeps its TAT in end, its
	// units not yet drained when last written in count, over the window
	// [0, TAT) (model.Key's form of a smooth key, which checks of other
	// kinds carry over), and in begin, negative, the instant its janitor
	// deadline was last set for (see smoothBegin).
	begin   int64
	end     int64
	blocked int64 // 0 when never blocked
	denied  int64 // the denial tally, as the Store contract keeps it
	events  []int64
	// leases are the slots held of a Concurrent check (lease.go), kept
	// apart from the count; nil for every other kind, which so pays one
	// pointer for them.
	leases *leaseSet
	// expires is when the janitor may drop the entry, in nanoseconds since
	// Store.start on the monotonic clock: housekeeping follows a relative
	// TTL, as Redis does, and never decides a check.
	expires int64
	// size is what the entry accounts in its shard's bytes (entry.heap),
	// kept so that dropping it gives back exactly what it took.
	size int64
	// An entry is 128 bytes, a size class of its own whose objects start
	// on 128-byte boundaries: two counters never share a cache line or its
	// prefetched pair. Smaller, counters made one after another sat side by
	// side, and two goroutines each counting its own id slowed each other
	// down (BenchmarkVersusRate; docs/benchmarks.md). TestCountersNeverShareACacheLine holds
	// it to 128.
}

const forever = math.MaxInt64

type config struct {
	shards   int
	interval time.Duration
	max      int
	maxBytes int64
}

// Option configures a Store.
type Option func(*config)

// WithShards sets the number of shards, rounded up to a power of two
// (default 64). More shards mean less lock contention between ids.
func WithShards(n int) Option { return func(c *config) { c.shards = n } }

// WithJanitorInterval sets how often expired state is dropped (default
// DefaultJanitorInterval); 0 or less turns the janitor off.
func WithJanitorInterval(d time.Duration) Option { return func(c *config) { c.interval = d } }

// WithMaxBytes bounds the heap the store's counters take (default
// DefaultMaxBytes); 0 or less removes the bound. A counter is accounted for
// what it holds, as Go's allocator rounds each part: the counter itself,
// its id (a copy of its own, so an id cut from a larger string never keeps
// the rest alive), its use type (counted as its own too, though it is
// mostly the rule's), a Sliding window's log (8 bytes an event, kept at
// the longest it has been), a Concurrent window's leases with their
// tokens, and a slot of its shard's map for each counter the map has held
// (both maps while a sweep rebuilds it). The store's fixed part, its shards
// and their empty maps, is not.
//
// The bound is kept per shard: each of the store's shards takes at most n
// divided by the number of shards. A counter goes to a shard by a hash of
// its use type and id with a random seed per Store, so counters spread
// evenly, the many use types of one id as the ids of one use type do, and
// no one can pick ids or use types that pile into one shard; a shard's
// share must hold the longest Sliding log or set of leases of a rule (up
// to 80 KiB and 475 KiB at the most their limits allow), or the store
// refuses it.
//
// When a call would add a counter to a full shard, or lengthen a sliding
// log or a set of leases beyond the room its array has, the shard first
// drops counters whose window and penalty are over, looking at about
// sweepSlice of them (the janitor's sweeps drop the rest); a shard that
// knows none can have expired, or looked in vain in the last second, does
// not look. If there is still no room, the call fails with an error that
// wraps both ErrFull and countlimit.ErrUnavailable, so the caller's failure
// policy decides (httplimit answers 503, or lets the request through under
// FailOpen). Counters the store already holds go on counting, denying,
// refunding and resetting as before, as long as they need no more memory.
// A call that is denied anyway is answered with its denial rather than an
// error, so a fail-open policy never turns it into a pass; its new counters
// are not kept, so it sets no penalty and tallies no denial for them.
//
// A full store never evicts a live counter, least recently used or not:
// whoever can fill it with new ids could then wipe out another id's count
// (a password-reset limit, a penalty box) and start it over. Refusing new
// ids keeps every count right, and lasts only until counters expire.
func WithMaxBytes(n int64) Option { return func(c *config) { c.maxBytes = n } }

// WithMaxEntries caps how many counters the store holds, besides
// WithMaxBytes' bound (by default there is no cap but that one); 0 or less
// removes the cap. A counter is one (UseType, id) pair, whatever its
// window. It bounds the janitor's work, not memory: the bytes a counter
// takes depend on its id and window.
//
// The cap is kept per shard, as WithMaxBytes' is: each shard holds at most
// n divided by the number of shards, rounded up, so the store as a whole
// takes about n. A full shard does what WithMaxBytes says.
func WithMaxEntries(n int) Option { return func(c *config) { c.max = n } }

// New returns an empty Store and starts its janitor.
func New(opts ...Option) *Store {
	cfg := config{shards: 64, interval: DefaultJanitorInterval, maxBytes: DefaultMaxBytes}
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
		s.fullEntries = fmt.Errorf("%w: no room for a new counter: its shard holds %d, its share of WithMaxEntries(%d) over %d shards; counters already held still work",
			ErrFull, s.perShard, cfg.max, n)
	}
	if cfg.maxBytes > 0 {
		s.perBytes = cfg.maxBytes / int64(n)
		s.fullBytes = fmt.Errorf("%w: no room for a new counter, or a longer sliding log or set of leases: its shard holds its share of WithMaxBytes(%d) over %d shards, %d bytes; counters already held still work",
			ErrFull, cfg.maxBytes, n, s.perBytes)
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

// Bytes reports how much of the heap the store accounts for its counters
// (see WithMaxBytes), expired ones the janitor has not dropped yet
// included.
func (s *Store) Bytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.used()
		sh.mu.Unlock()
	}
	return n
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

// Do implements driver.Store. A request that needs more memory than its
// shard has room for fails with ErrFull (see WithMaxBytes).
func (s *Store) Do(ctx context.Context, r *driver.Request) error {
	if err := ctx.Err(); err != nil {
		return driver.Unavailable(err)
	}
	if s.closed.Load() {
		return driver.Unavailable(errClosed)
	}
	if err := s.apply(r); err != nil {
		return driver.Unavailable(err)
	}
	return nil
}

// key is what a counter is found by.
type key struct{ useType, id string }

// hash is the hash of a counter's key, seeded per Store so that nobody can
// choose keys that pile into one shard: its low bits pick the shard, and
// the whole is the key of the counter's chain in the shard's map. The use
// type is hashed with the id, so that one id's counters spread over the
// shards, and their bytes over the shards' shares of WithMaxBytes, as many
// ids' do, and a lookup walks past none of the id's other counters.
func (s *Store) hash(ut, id string) uint64 { return maphash.Comparable(s.seed, key{ut, id}) }

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

// slot is one check of a request while apply works on it: its key's hash
// and shard, its entry and view, and what its State needs from the entry,
// read under the shard's lock so the State is built after it is let go.
type slot struct {
	h       uint64
	sh      *shard
	e       *entry
	v       view
	blocked int64 // the entry's penalty end; 0 for none
	freeAt  int64 // a sliding denial's State.FreeAt, when free
	free    bool
}

// inline is how many checks a request may have before apply's scratch
// space leaves the stack.
const inline = 2

// inlineShards is how many shards a request may lock before the list of
// them leaves the stack (see order): an AllowAll of up to that many rules.
const inlineShards = 8

// apply carries out one request. The checks of a request have distinct
// UseTypes (the Limiter makes sure), so each check's entry is looked up
// once: the locks of the checks' shards are held for the lookups and the
// counter updates, and the States are built after they are let go.
//
// It is a copy, kept for speed, of model.Apply, the reference model of
// the driver.Store contract; docs/ARCHITECTURE.md ("The copies") lists
// every copy, in each store, and why it stays. A rule changes in
// model.Apply first, then here and in each copy there. TestModel (internal/modeltest) holds
// memstore and every other store's paths to model.Apply, comparing
// Results and stored state after each of its seeded steps; it names the
// copy that was forgotten.
func (s *Store) apply(r *driver.Request) error {
	var buf [inline]slot
	var slots []slot
	if len(r.Checks) <= inline {
		slots = buf[:len(r.Checks)]
	} else {
		slots = make([]slot, len(r.Checks)) // AllowAll of more rules
	}
	for i := range slots {
		h := maphash.Comparable(s.seed, key{r.Checks[i].UseType, r.ID}) // s.hash, inlined
		slots[i].h, slots[i].sh = h, s.shard(h)
	}
	var held [inlineShards]*shard
	locked := held[:1]
	if len(slots) == 1 {
		held[0] = slots[0].sh // most requests: nothing to order
	} else {
		locked = order(held[:0], slots)
	}
	if r.Op == driver.OpReset {
		for _, sh := range locked {
			sh.mu.Lock()
		}
		for i := range r.Checks {
			slots[i].sh.remove(slots[i].h, r.Checks[i].UseType, r.ID)
		}
		for _, sh := range locked {
			sh.mu.Unlock()
		}
		return nil
	}
	if r.OnLeases() {
		return s.leaseOp(r, slots[0].h, slots[0].sh)
	}
	now := r.Now.UnixMicro()
	n := r.N
	if r.Op != driver.OpAllow {
		n = 1
	}

	for _, sh := range locked {
		sh.mu.Lock()
	}
	ok, grows := true, false
	for i := range r.Checks {
		c, sl := &r.Checks[i], &slots[i]
		sh, h := sl.sh, sl.h
		sl.e = sh.get(h, c.UseType, r.ID)
		if r.Op == driver.OpRefund && sl.e != nil {
			look(&sl.v, sl.e, c, now)
			s.refund(sl.e, c, &sl.v, r.N)
		}
		look(&sl.v, sl.e, c, now)
		ok = ok && sl.v.fits(c, n)
		grows = grows || sl.e == nil || (c.Span > 0 && sl.v.used+n > int64(cap(sl.e.events)))
	}
	room := true // for what this request adds
	if r.Op == driver.OpAllow && grows && (s.perShard > 0 || s.perBytes > 0) {
		var err error
		if room, err = s.makeRoom(locked, r, slots, ok, n, now); err != nil {
			for _, sh := range locked {
				sh.mu.Unlock()
			}
			return err
		}
	}
	for i := range r.Checks {
		c, sl := &r.Checks[i], &slots[i]
		sh, h := sl.sh, sl.h
		if r.Op == driver.OpAllow && (ok || !sl.v.fits(c, n)) && (sl.e != nil || room) {
			if sl.e == nil {
				sl.e = newEntry(c.UseType, r.ID, now) // an empty window until counted
				sh.add(h, sl.e)
			}
			s.write(sh, sl.e, c, &sl.v, ok, n, now)
		}
		if e := sl.e; e != nil {
			sl.blocked = e.blocked
			if c.Span > 0 && !ok && n <= c.Limit && sl.v.used+n > c.Limit {
				switch until := sl.v.until; {
				case until == 0:
					sl.freeAt, sl.free = e.events[sl.v.live+int(sl.v.used+n-c.Limit)-1], true
				case until != forever: // a carried count leaves the log when its window ends
					sl.freeAt, sl.free = until-c.Span.Microseconds(), true
				}
			}
		}
		if c.Interval > 0 && !ok && c.Limit > 0 && n <= c.Burst && !smoothFits(c, sl.v.ahead, n) {
			t := c.Interval.Microseconds()
			switch until := sl.v.until; {
			case until == 0:
				sl.freeAt, sl.free = now+sl.v.ahead+n*t-c.Burst*t, true
			case until != forever: // a carried count drains when its window ends
				sl.freeAt, sl.free = until, true
			}
		}
	}
	for _, sh := range locked {
		sh.mu.Unlock()
	}

	for i := range r.Checks {
		state(&r.Checks[i], &slots[i], ok, now)
	}
	return nil
}

// order appends to held the shards of the slots' counters, each once, in
// the order of their places in Store.shards: the order in which every
// request locks its shards, so that two requests that share shards never
// wait for each other in a cycle. apply locks and unlocks them in its own
// body, where a mutex's Lock and Unlock are inlined.
func order(held []*shard, slots []slot) []*shard {
	for i := range slots {
		sh := slots[i].sh
		j := len(held)
		for j > 0 && before(sh, held[j-1]) {
			j--
		}
		if j > 0 && held[j-1] == sh {
			continue
		}
		held = append(held, sh)
		copy(held[j+1:], held[j:])
		held[j] = sh
	}
	return held
}

// before reports whether a comes before b in Store.shards. The shards are
// the elements of one array, which Go's heap never moves, so the order of
// their addresses is the order of their places.
func before(a, b *shard) bool { return uintptr(unsafe.Pointer(a)) < uintptr(unsafe.Pointer(b)) }

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
