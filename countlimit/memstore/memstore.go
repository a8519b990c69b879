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
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/countlimit/countlimit/countlimit/driver"
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
// model.Apply first, then here and in each copy there. TestModel (internal/testkit/modeltest) holds
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
