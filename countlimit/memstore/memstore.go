// Package memstore is the in-process countlimit.Store: sharded maps behind
// mutexes, with a janitor that drops expired state. It is the embedded
// default of the countlimit command and the store for tests and single-process
// services. State is lost when the process exits.
//
// All counters of one id live in one shard, so a multi-rule check takes one
// lock. Checking an existing key allocates nothing.
package memstore

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

var _ countlimit.Store = (*Store)(nil)

// DefaultJanitorInterval is how often the janitor sweeps expired state.
const DefaultJanitorInterval = time.Minute

// Store keeps counters in memory. It is safe for concurrent use. Create it
// with New and stop its janitor with Close.
type Store struct {
	shards []shard
	mask   uint64
	start  time.Time // origin of the monotonic expiry deadlines

	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type shard struct {
	mu sync.Mutex
	m  map[key]*entry
	_  [48]byte // keep neighbouring shards' locks off one cache line
}

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
}

// Option configures a Store.
type Option func(*config)

// WithShards sets the number of shards, rounded up to a power of two
// (default 64). More shards mean less lock contention between ids.
func WithShards(n int) Option { return func(c *config) { c.shards = n } }

// WithJanitorInterval sets how often expired state is dropped (default
// DefaultJanitorInterval); 0 or less turns the janitor off.
func WithJanitorInterval(d time.Duration) Option { return func(c *config) { c.interval = d } }

// New returns an empty Store and starts its janitor.
func New(opts ...Option) *Store {
	cfg := config{shards: 64, interval: DefaultJanitorInterval}
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
		start:  time.Now(),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[key]*entry)
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

// Len reports how many counters the store holds.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Do implements countlimit.Store.
func (s *Store) Do(ctx context.Context, reqs []*countlimit.Request) error {
	if err := ctx.Err(); err != nil {
		return countlimit.Unavailable(err)
	}
	if s.closed.Load() {
		return countlimit.Unavailable(errClosed)
	}
	for _, r := range reqs {
		s.apply(r)
	}
	return nil
}

func (s *Store) shard(id string) *shard {
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return &s.shards[h&s.mask]
}

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

func (s *Store) apply(r *countlimit.Request) {
	sh := s.shard(r.ID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := r.Now.UnixMicro()

	if r.Op == countlimit.OpReset {
		for i := range r.Checks {
			delete(sh.m, key{r.Checks[i].UseType, r.ID})
		}
		return
	}
	if r.Op == countlimit.OpRefund {
		for i := range r.Checks {
			c := &r.Checks[i]
			if e := sh.m[key{c.UseType, r.ID}]; e != nil {
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
		ok = ok && look(sh.m[key{c.UseType, r.ID}], c, now).fits(c, n)
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		k := key{c.UseType, r.ID}
		e := sh.m[k]
		v := look(e, c, now)
		if r.Op == countlimit.OpAllow && (ok || !v.fits(c, n)) {
			if e == nil {
				e = &entry{begin: now, end: now} // an empty window until counted
				sh.m[k] = e
			}
			v = s.write(e, c, v, ok, n, now)
		}
		state(&c.State, e, c, v, ok, n, now)
	}
}

// write counts n (allowed) or records the denial of an entry, and returns
// the view after it.
func (s *Store) write(e *entry, c *countlimit.Check, v view, allowed bool, n, now int64) view {
	e.limit = c.Limit
	if !allowed {
		e.denied++
		if !v.blocked && c.Block > 0 {
			e.blocked = now + c.Block.Microseconds()
			v.blocked = true
		}
		s.touch(e, now)
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
	s.touch(e, now)
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
func (s *Store) touch(e *entry, now int64) {
	mono := int64(time.Since(s.start))
	ttl := max(e.end, e.blocked) - now // µs
	if ttl >= (forever-mono)/int64(time.Microsecond) {
		e.expires = forever // lifetime, or beyond what the clock can hold
		return
	}
	e.expires = mono + ttl*int64(time.Microsecond)
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

// sweep drops every entry whose window and penalty are over.
func (s *Store) sweep() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		mono := int64(time.Since(s.start))
		for k, e := range sh.m {
			if e.expires <= mono {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}
