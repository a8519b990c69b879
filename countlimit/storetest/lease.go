package storetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/testkit/leaseforge"
)

// leaseTests are the cases for Concurrent windows; Run runs them with the
// rest.
var leaseTests = []struct {
	name string
	fn   func(*testing.T, func(*testing.T) driver.Store)
}{
	{"LeaseAcquireRelease", testLeaseAcquireRelease},
	{"LeaseExpires", testLeaseExpires},
	{"LeaseExtend", testLeaseExtend},
	{"LeaseForged", testLeaseForged},
	{"LeaseBlock", testLeaseBlock},
	{"LeaseLimitZero", testLeaseLimitZero},
	{"LeaseKeptApartFromCounts", testLeaseKeptApart},
	{"LeasesUnderContention", testLeasesUnderContention},
}

// acquire takes a slot at the clock's time and checks the Result; it
// returns the lease (the zero Lease when denied).
func (e *env) acquire(rule countlimit.Rule, id string, at time.Time, want countlimit.Result) countlimit.Lease {
	e.t.Helper()
	e.clock.Set(at)
	lease, got, err := e.l.Acquire(e.ctx, rule, id)
	if err != nil {
		e.t.Fatalf("Acquire at %s: %v", fmtTime(at), err)
	}
	if d := diff(got, want); d != "" {
		e.t.Errorf("Acquire(limit=%d) at %s:\n%s", rule.Limit, fmtTime(at), d)
	}
	if got.Allowed != (lease != countlimit.Lease{}) {
		e.t.Errorf("Acquire at %s: Allowed %v with lease %q", fmtTime(at), got.Allowed, lease)
	}
	return lease
}

// release gives lease back at at, which must not fail.
func (e *env) release(lease countlimit.Lease, at time.Time) {
	e.t.Helper()
	e.clock.Set(at)
	if err := lease.Release(e.ctx); err != nil {
		e.t.Fatalf("Release at %s: %v", fmtTime(at), err)
	}
}

// held checks how many slots of rule id holds at at, with Peek.
func (e *env) held(rule countlimit.Rule, id string, at time.Time, want int64) {
	e.t.Helper()
	e.clock.Set(at)
	r, err := e.l.Peek(e.ctx, rule, id)
	if err != nil {
		e.t.Fatalf("Peek at %s: %v", fmtTime(at), err)
	}
	if r.Used != want {
		e.t.Errorf("Peek at %s: %d slots held, want %d", fmtTime(at), r.Used, want)
	}
}

// testLeaseAcquireRelease: 2 slots of 10 s; a third caller waits for the
// earliest lease, a release frees its slot at once, and releasing twice
// frees nothing more.
func testLeaseAcquireRelease(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "lease"), Limit: 2, Window: countlimit.Concurrent(10 * time.Second)}
	a := e.acquire(rule, "u", at(0), ok(2, 1, at(sec(10))))
	e.acquire(rule, "u", at(sec(1)), ok(2, 2, at(sec(10))))
	e.acquire(rule, "u", at(sec(2)), no(2, 2, at(sec(10)), sec(8)))
	e.clock.Set(at(sec(2)))
	if r, err := e.l.Peek(e.ctx, rule, "u"); err != nil || r.Allowed || r.Used != 2 {
		t.Errorf("Peek with both slots held = %+v, %v; want denied with 2 held", r, err)
	}
	e.release(a, at(sec(3)))
	e.held(rule, "u", at(sec(3)), 1)
	// The earliest lease now is the one taken at 1 s.
	c := e.acquire(rule, "u", at(sec(4)), ok(2, 2, at(sec(11))))
	e.release(a, at(sec(5)))
	e.held(rule, "u", at(sec(5)), 2)
	if expose.LeaseTTL(c) != 10*time.Second || expose.LeaseUseType(c) != string(rule.UseType) || c.ID() != "u" || len(leaseforge.Token(c.String())) != 22 {
		t.Errorf("lease = %s %q ttl %v token %q", expose.LeaseUseType(c), c.ID(), expose.LeaseTTL(c), leaseforge.Token(c.String()))
	}
	// Another id has its own slots.
	e.acquire(rule, "v", at(sec(5)), ok(2, 1, at(sec(15))))
}

// testLeaseExpires: a holder that never releases frees its slot ttl after
// it took it; its late Release frees nothing of the next holder's, and its
// Extend fails with ErrLeaseExpired.
func testLeaseExpires(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "lease.expires"), Limit: 1, Window: countlimit.Concurrent(10 * time.Second)}
	ms := time.Millisecond
	crashed := e.acquire(rule, "u", at(0), ok(1, 1, at(sec(10))))
	e.acquire(rule, "u", at(sec(10)-ms), no(1, 1, at(sec(10)), ms))
	e.held(rule, "u", at(sec(10)), 0)
	next := e.acquire(rule, "u", at(sec(10)), ok(1, 1, at(sec(20))))
	e.clock.Set(at(sec(11)))
	if err := crashed.Extend(e.ctx); !errors.Is(err, countlimit.ErrLeaseExpired) {
		t.Errorf("Extend of an expired lease = %v, want ErrLeaseExpired", err)
	}
	e.release(crashed, at(sec(11)))
	e.held(rule, "u", at(sec(11)), 1)
	e.release(next, at(sec(12)))
	e.held(rule, "u", at(sec(12)), 0)
	e.clock.Set(at(sec(12)))
	if err := next.Extend(e.ctx); !errors.Is(err, countlimit.ErrLeaseExpired) {
		t.Errorf("Extend of a released lease = %v, want ErrLeaseExpired", err)
	}
}

// testLeaseExtend: Extend pushes the expiry to now + ttl.
func testLeaseExtend(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "lease.extend"), Limit: 1, Window: countlimit.Concurrent(10 * time.Second)}
	a := e.acquire(rule, "u", at(0), ok(1, 1, at(sec(10))))
	e.clock.Set(at(sec(8)))
	if err := a.Extend(e.ctx); err != nil {
		t.Fatalf("Extend of a live lease: %v", err)
	}
	e.acquire(rule, "u", at(sec(12)), no(1, 1, at(sec(18)), sec(6)))
	e.acquire(rule, "u", at(sec(18)), ok(1, 1, at(sec(28))))
}

// testLeaseForged: a lease string that was edited, truncated, names another
// id than its token was taken for, or is garbage is ErrInvalid and frees
// nothing; a lease written by String in one process is released by another.
func testLeaseForged(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "lease.forged"), Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	alice := e.acquire(rule, "alice", at(0), ok(1, 1, at(time.Minute)))
	bob := e.acquire(rule, "bob", at(0), ok(1, 1, at(time.Minute)))
	s := alice.String()
	e.held(rule, "bob", at(sec(1)), 1)
	e.held(rule, "alice", at(sec(1)), 1)

	// A forgery whose checksum is recomputed (a Limiter without a lease key
	// cannot tell it from a lease that expired): alice's id with bob's
	// token, and with a made-up token. The store holds neither token under
	// alice's key, so nothing is freed.
	for name, token := range map[string]string{"bob's token": leaseforge.Token(bob.String()), "a made-up token": strings.Repeat("Q", 22)} {
		f := leaseforge.Unsigned(rule.UseType, "alice", time.Minute, token)
		forgedLease, err := e.l.ParseLease(f, rule)
		if err != nil {
			t.Fatalf("ParseLease of a forgery with a recomputed checksum (%s) = %v: the checksum oracle no longer matches Lease.String", name, err)
		}
		if err := forgedLease.Release(e.ctx); err != nil {
			t.Errorf("Release of alice's id with %s = %v, want nil (as for an expired lease)", name, err)
		}
		if err := forgedLease.Extend(e.ctx); !errors.Is(err, countlimit.ErrLeaseExpired) {
			t.Errorf("Extend of alice's id with %s = %v, want ErrLeaseExpired", name, err)
		}
	}
	e.held(rule, "bob", at(sec(1)), 1)
	e.held(rule, "alice", at(sec(1)), 1)

	// Another process: a Limiter on another store sharing the state.
	l2 := countlimit.New(newStore(t), countlimit.WithClock(e.clock.Now))
	parsed, err := l2.ParseLease(s, rule)
	if err != nil {
		t.Fatalf("ParseLease(String()) = %v", err)
	}
	if expose.LeaseUseType(parsed) != string(rule.UseType) || parsed.ID() != "alice" || parsed.String() != alice.String() || expose.LeaseTTL(parsed) != time.Minute {
		t.Errorf("ParseLease(String()) = %s %q %q %v; want the lease back", expose.LeaseUseType(parsed), parsed.ID(), parsed.String(), expose.LeaseTTL(parsed))
	}
	if err := parsed.Extend(e.ctx); err != nil {
		t.Errorf("Extend of a parsed lease: %v", err)
	}
	if err := parsed.Release(e.ctx); err != nil {
		t.Errorf("Release of a parsed lease: %v", err)
	}
	e.held(rule, "alice", at(sec(2)), 0)
	e.held(rule, "bob", at(sec(2)), 1)
	if (countlimit.Lease{}).String() != "" || (countlimit.Lease{}).Release(e.ctx) != nil {
		t.Error("the zero Lease: String must be empty and Release a no-op")
	}
	if err := (countlimit.Lease{}).Extend(e.ctx); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Extend of the zero Lease = %v, want ErrInvalid", err)
	}
}

// testLeaseBlock: a denied Acquire of a rule with Block sets the penalty;
// a release does not lift it.
func testLeaseBlock(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "lease.block"), Limit: 1, Window: countlimit.Concurrent(10 * time.Second), Block: time.Minute}
	a := e.acquire(rule, "u", at(0), ok(1, 1, at(sec(10))))
	e.acquire(rule, "u", at(sec(1)), blocked(no(1, 1, at(sec(10)), time.Minute), at(sec(61))))
	e.release(a, at(sec(2)))
	e.acquire(rule, "u", at(sec(3)), blocked(no(1, 0, at(sec(3)), sec(58)), at(sec(61))))
	e.acquire(rule, "u", at(sec(61)), ok(1, 1, at(sec(71))))
}

// testLeaseLimitZero: no slot ever.
func testLeaseLimitZero(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "lease.zero"), Limit: 0, Window: countlimit.Concurrent(10 * time.Second)}
	e.acquire(rule, "u", at(0), no(0, 0, at(0), -1))
}

// testLeaseKeptApart: a UseType's count and its leases do not see each
// other; Reset forgets both.
func testLeaseKeptApart(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	ut := UseType(t, "lease.apart")
	slots := countlimit.Rule{UseType: ut, Limit: 1, Window: countlimit.Concurrent(10 * time.Second)}
	fixed := countlimit.Rule{UseType: ut, Limit: 1, Window: countlimit.Fixed(time.Hour)}
	e.run(fixed, "u", []step{{at: at(0), want: ok(1, 1, at(time.Hour))}})
	e.acquire(slots, "u", at(sec(1)), ok(1, 1, at(sec(11))))
	e.run(fixed, "u", []step{{at: at(sec(2)), op: peek, want: no(1, 1, at(time.Hour), time.Hour-sec(2))}})
	e.clock.Set(at(sec(3)))
	if err := e.l.Reset(e.ctx, slots, "u"); err != nil {
		t.Fatal(err)
	}
	e.held(slots, "u", at(sec(3)), 0)
	e.run(fixed, "u", []step{{at: at(sec(3)), op: peek, want: ok(1, 0, at(time.Hour))}})
	e.acquire(slots, "u", at(sec(4)), ok(1, 1, at(sec(14))))
}

// testLeasesUnderContention: 64 goroutines on two stores sharing state each
// Acquire, hold for a few ms, and Release, for 3 s (and then on until each
// has held a slot), on the real clock, with 5 slots, pausing between holds. Each holder records when it held its slot (from Acquire's return
// to the Release call, which lies inside the store's own interval); at no
// instant may more than 5 of those intervals overlap, and every goroutine
// must get slots.
func testLeasesUnderContention(t *testing.T, newStore func(*testing.T) driver.Store) {
	if testing.Short() {
		t.Skip("3 s of contention; skipped with -short")
	}
	ls := []*countlimit.Limiter{countlimit.New(newStore(t)), countlimit.New(newStore(t))}
	rule := countlimit.Rule{UseType: UseType(t, "lease.contention"), Limit: 5, Window: countlimit.Concurrent(time.Minute)}
	type interval struct{ from, to time.Time }
	var (
		mu    sync.Mutex
		held  []interval
		perG  [64]int
		errs  []error
		wg    sync.WaitGroup
		ctx   = context.Background()
		until = time.Now().Add(3 * time.Second)
	)
	for g := range perG {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := ls[g%2]
			// After the 3 s, a goroutine that has had no slot yet keeps
			// trying, alone with the others that had none, until it gets
			// one: the limiter keeps no queue, so a waiter can lose every
			// race while the others go on, but not once they stop. Within
			// the ttl (RetryAfter), every goroutine must have held a slot.
			more := func() bool {
				now := time.Now()
				return now.Before(until) || perGot(&mu, &perG[g]) == 0 && now.Before(until.Add(expose.WindowOf(rule.Window).Duration))
			}
			for more() {
				lease, r, err := l.Acquire(ctx, rule, "hot")
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if !r.Allowed {
					time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
					continue
				}
				from := time.Now()
				time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
				to := time.Now()
				err = lease.Release(ctx)
				mu.Lock()
				held = append(held, interval{from, to})
				perG[g]++
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
				// Work between holds, as a real holder does: without it, a
				// holder takes its slot straight back before the waiters
				// wake, and the limiter (which keeps no queue) lets it.
				time.Sleep(time.Duration(1+rand.IntN(4)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs[:min(len(errs), 3)] {
		t.Errorf("under contention: %v", err)
	}
	type edge struct {
		at   time.Time
		step int
	}
	edges := make([]edge, 0, 2*len(held))
	for _, h := range held {
		edges = append(edges, edge{h.from, +1}, edge{h.to, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].step < edges[j].step // an end at the same instant first
	})
	most, now := 0, 0
	for _, e := range edges {
		now += e.step
		most = max(most, now)
	}
	if most > int(rule.Limit) {
		t.Errorf("%d holders at once, limit %d", most, rule.Limit)
	}
	// A store that flushes every acquire to disk may never have all 5 held
	// at once on a small machine; one that held one at a time has not let
	// them run concurrently at all. (LeaseAcquireRelease pins that every
	// slot can be held.)
	if most < 2 {
		t.Errorf("at most %d holder at once over %d holds: the slots were never shared", most, len(held))
	}
	for g, n := range perG {
		if n == 0 {
			t.Errorf("goroutine %d never got a slot within the ttl (%d holds in all)", g, len(held))
		}
	}
	t.Logf("%d holds, at most %d at once", len(held), most)
	r, err := ls[0].Peek(ctx, rule, "hot")
	if err != nil || r.Used != 0 {
		t.Errorf("after every release: %d held (%v), want 0", r.Used, err)
	}
}

// perGot reads a goroutine's count of holds under mu.
func perGot(mu *sync.Mutex, n *int) int {
	mu.Lock()
	defer mu.Unlock()
	return *n
}
