// Package memstore is the in-process countlimit.Store: sharded maps behind
// mutexes, with a janitor that drops expired state. It is the embedded
// default of the countlimit command and the store for tests and single-process
// services. State is lost when the process exits.
//
// All counters of one id live in one shard, so a multi-rule check takes one
// lock. Checking an existing key allocates nothing.
//
// # Memory
//
// A counter costs about 200 bytes with its key (a Sliding window adds 8
// bytes per logged event). The store holds at most [DefaultMaxEntries]
// counters, about 200 MB, unless [WithMaxEntries] says otherwise; when it
// is full, calls that would add a counter fail and the counters it holds go
// on working (see WithMaxEntries for why it never evicts a live one).
//
// The janitor drops a counter once its window and penalty are over. It
// sweeps a shard [SweepSlice] counters at a time, letting go of the shard's
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

	"github.com/countlimit/countlimit/countlimit"
)

var _ countlimit.Store = (*Store)(nil)

const (
	// DefaultJanitorInterval is how often the janitor sweeps expired state.
	DefaultJanitorInterval = time.Minute
	// DefaultMaxEntries is how many counters a Store holds unless
	// WithMaxEntries says otherwise: about 200 MB, so that the countlimit
	// service, which keeps its counters here by default, cannot be made to
	// exhaust its memory by a flood of new ids.
	DefaultMaxEntries = 1 << 20
	// SweepSlice is the most counters the janitor looks at, or moves into
	// a fresh map, per hold of a shard's lock: a few hundred microseconds
	// at most (each costs a cache miss or two), so that no check waits long
	// behind a sweep. A call that finds its shard full looks at no more.
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
	m  map[key]*entry
	// old is a map a sweep is moving into m, a slice at a time, to give its
	// buckets back; nil otherwise. A key is in one of the two, never both.
	old map[key]*entry
	// peak is the most counters m has held: what its buckets are sized for.
	peak int
	// No counter expires before soonest (in Store.mono's terms), or a full
	// shard looked for expired ones in vain and waits until soonest to look
	// again. A full shard with soonest ahead refuses at once.
	soonest int64
	// low is the soonest expiry set since the running sweep began, so the
	// sweep's own lower bound misses no counter it did not see.
	low int64
	_   [16]byte // keep neighbouring shards' locks off one cache line
}

func (sh *shard) get(k key) *entry {
	e := sh.m[k]
	if e == nil && sh.old != nil {
		e = sh.old[k]
	}
	return e
}

func (sh *shard) len() int { return len(sh.m) + len(sh.old) }

type key struct {
	useType countlimit.UseType
	id      string
}

// entry is one (use type, id) counter. Times are Unix microseconds.
type entry struct {
	count   int64
	denied  int64
	limit   int64
	begin   int64
	end     int64 // forever for lifetime windows
	blocked int64 // 0 when never blocked
	events  []int64
	// expires is when the janitor may drop the entry, in nanoseconds since
	// Store.start on the monotonic clock: housekeeping follows a relative
	// TTL, as Redis does, and never decides a check.
	expires int64
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
// counters whose window and penalty are over, looking at no more than
// SweepSlice of them (the janitor's sweeps drop the rest); a shard that knows
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
		s.shards[i].m = make(map[key]*entry)
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
		n += sh.len()
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

func (s *Store) shard(id string) *shard {
	return &s.shards[maphash.String(s.seed, id)&s.mask]
}

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

func look(e *entry, c *countlimit.Check, now int64) view {
	fresh := view{begin: c.Begin.UnixMicro(), end: micros(c.End)}
	if e == nil {
		return fresh
	}
	blocked := e.blocked > now
	if span := c.Span.Microseconds(); span > 0 {
		v := view{blocked: blocked}
		for v.live < len(e.events) && e.events[v.live] <= now-span {
			v.live++
		}
		if v.used = int64(len(e.events) - v.live); v.used > 0 {
			v.begin, v.end = e.events[v.live], e.events[len(e.events)-1]+span
		}
		return v
	}
	if e.begin < e.end && now < e.end {
		return view{used: e.count, begin: e.begin, end: e.end, blocked: blocked}
	}
	fresh.blocked = blocked
	return fresh
}

func (v view) fits(c *countlimit.Check, n int64) bool { return !v.blocked && n <= c.Limit-v.used }

func (s *Store) apply(r *countlimit.Request) error {
	sh := s.shard(r.ID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := r.Now.UnixMicro()

	if r.Op == countlimit.OpReset {
		for i := range r.Checks {
			k := key{r.Checks[i].UseType, r.ID}
			delete(sh.m, k)
			if sh.old != nil {
				delete(sh.old, k)
			}
		}
		return nil
	}
	if r.Op == countlimit.OpRefund {
		for i := range r.Checks {
			c := &r.Checks[i]
			if e := sh.get(key{c.UseType, r.ID}); e != nil {
				s.refund(e, c, look(e, c, now), r.N, now)
			}
		}
	}

	n := r.N
	if r.Op != countlimit.OpAllow {
		n = 1
	}
	ok := true
	for i := range r.Checks {
		c := &r.Checks[i]
		ok = ok && look(sh.get(key{c.UseType, r.ID}), c, now).fits(c, n)
	}
	room := true // for the counters this request adds
	if r.Op == countlimit.OpAllow && s.perShard > 0 && sh.len()+len(r.Checks) > s.perShard {
		need := 0
		for i := range r.Checks {
			if sh.get(key{r.Checks[i].UseType, r.ID}) == nil {
				need++
			}
		}
		room = sh.len()+need <= s.perShard || (ok && s.reclaim(sh, need))
		if !room && ok {
			return s.errFull
		}
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		k := key{c.UseType, r.ID}
		e := sh.get(k)
		v := look(e, c, now)
		if r.Op == countlimit.OpAllow && (ok || !v.fits(c, n)) && (e != nil || room) {
			if e == nil {
				e = &entry{begin: now, end: now} // an empty window until counted
				sh.m[k] = e
				sh.peak = max(sh.peak, len(sh.m))
			}
			v = s.write(sh, e, c, v, ok, n, now)
		}
		state(&c.State, e, c, v, ok, n, now)
	}
	return nil
}

// reclaim makes room for need more counters in a full shard by dropping
// expired ones, looking at no more than SweepSlice, and reports whether they
// fit now.
func (s *Store) reclaim(sh *shard, need int) bool {
	mono := s.mono()
	if mono < sh.soonest {
		return false
	}
	s.looks.Add(1)
	seen, low := 0, int64(forever)
	for _, m := range [...]map[key]*entry{sh.old, sh.m} {
		for k, e := range m {
			if seen == SweepSlice {
				if sh.len()+need > s.perShard {
					sh.soonest = mono + lookAgain
					return false
				}
				return true
			}
			seen++
			if e.expires <= mono {
				delete(m, k)
			} else {
				low = min(low, e.expires)
			}
		}
	}
	sh.soonest = low // it saw every counter
	return sh.len()+need <= s.perShard
}

// write counts n (allowed) or records the denial of an entry, and returns
// the view after it.
func (s *Store) write(sh *shard, e *entry, c *countlimit.Check, v view, allowed bool, n, now int64) view {
	e.limit = c.Limit
	if !allowed {
		e.denied++
		if !v.blocked && c.Block > 0 {
			e.blocked = now + c.Block.Microseconds()
			v.blocked = true
		}
		s.touch(sh, e, now)
		return v
	}
	if span := c.Span.Microseconds(); span > 0 {
		e.events = insertSorted(append(e.events[:0], e.events[v.live:]...), now, int(n))
		e.count = int64(len(e.events))
		e.begin, e.end = e.events[0], e.events[len(e.events)-1]+span
	} else {
		e.count = v.used + n
		e.begin, e.end = v.begin, v.end
		e.events = e.events[:0]
	}
	s.touch(sh, e, now)
	return view{used: v.used + n, begin: e.begin, end: e.end, live: 0}
}

func (s *Store) refund(e *entry, c *countlimit.Check, v view, n, now int64) {
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

// touch sets the janitor's deadline from the entry's window and penalty.
func (s *Store) touch(sh *shard, e *entry, now int64) {
	mono := s.mono()
	ttl := max(e.end, e.blocked) - now // µs
	if ttl >= (forever-mono)/int64(time.Microsecond) {
		e.expires = forever // lifetime, or beyond what the clock can hold
		return
	}
	e.expires = mono + ttl*int64(time.Microsecond)
	sh.soonest = min(sh.soonest, e.expires)
	sh.low = min(sh.low, e.expires)
}

func state(st *countlimit.State, e *entry, c *countlimit.Check, v view, allowed bool, n, now int64) {
	*st = countlimit.State{Allowed: allowed, Used: v.used}
	if c.Span == 0 || v.used > 0 {
		st.Begin, st.End = time.UnixMicro(v.begin), timeOf(v.end)
	}
	if e == nil {
		return
	}
	if e.blocked > now {
		st.BlockedUntil = time.UnixMicro(e.blocked)
	}
	if c.Span > 0 && !allowed && n <= c.Limit && v.used+n > c.Limit {
		st.FreeAt = time.UnixMicro(e.events[v.live+int(v.used+n-c.Limit)-1])
	}
}

func micros(t time.Time) int64 {
	if t.IsZero() {
		return forever
	}
	return t.UnixMicro()
}

func timeOf(us int64) time.Time {
	if us == forever {
		return time.Time{}
	}
	return time.UnixMicro(us)
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
		sh.old, sh.m = sh.m, make(map[key]*entry, len(sh.m))
		sh.peak = len(sh.old)
		low = min(low, s.drain(sh, sh.old, sh.m))
		sh.old = nil
	}
	sh.soonest = min(low, sh.low)
}

// drain walks m, SweepSlice entries per hold of sh's lock, drops the
// expired ones and, when to is not nil, moves the others into it. It
// returns the soonest expiry it kept. sh is locked on entry and on return.
//
// The lock is let go only at the end of an iteration, so the next key and
// entry are read under it and are never stale. A Go map may change between
// the steps of a range loop: an entry deleted meanwhile is not produced,
// and one added meanwhile may or may not be; checks add new keys to sh.m
// only, so while m is sh.old, a key is always in exactly one of the two.
func (s *Store) drain(sh *shard, m, to map[key]*entry) int64 {
	mono, low, seen := s.mono(), int64(forever), 0
	for k, e := range m {
		switch {
		case e.expires <= mono:
			delete(m, k)
		case to != nil:
			to[k] = e
			delete(m, k)
			fallthrough
		default:
			low = min(low, e.expires)
		}
		if seen++; seen == SweepSlice {
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
