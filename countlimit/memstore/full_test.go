package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// stale adds a counter for id whose window is already over, so the next
// sweep, or a full shard, may drop it.
func stale(t testing.TB, l *countlimit.Limiter, id string) {
	t.Helper()
	ok, err := l.CheckLimit(context.Background(), "stale", id, 1, time.Hour, expose.Now(l).Add(-2*time.Hour))
	if err != nil || !ok {
		t.Errorf("CheckLimit(stale, %q) = %v, %v; want true, nil", id, ok, err)
	}
}

func isFull(err error) bool {
	return errors.Is(err, memstore.ErrFull) && errors.Is(err, countlimit.ErrUnavailable)
}

func TestMaxEntriesPerShard(t *testing.T) {
	t.Parallel()
	tests := []struct {
		opts []memstore.Option
		want int
	}{
		{nil, 0}, // by default only the bytes are bounded
		{[]memstore.Option{memstore.WithMaxEntries(1000)}, 16},
		{[]memstore.Option{memstore.WithMaxEntries(10), memstore.WithShards(4)}, 3},
		{[]memstore.Option{memstore.WithMaxEntries(1), memstore.WithShards(4)}, 1},
		{[]memstore.Option{memstore.WithMaxEntries(0)}, 0},
		{[]memstore.Option{memstore.WithMaxEntries(-1)}, 0},
	}
	for i, tc := range tests {
		s := memstore.New(append(tc.opts, memstore.WithJanitorInterval(0))...)
		if got := memstore.PerShard(s); got != tc.want {
			t.Errorf("case %d: a shard holds %d, want %d", i, got, tc.want)
		}
		s.Close()
	}
}

// TestFullStore walks one shard with room for three counters through what
// a full store must do: refuse new counters, and keep every counter it has
// working exactly as before.
func TestFullStore(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithShards(1), memstore.WithMaxEntries(3), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	clock := storetest.NewClock(t0)
	l := countlimit.New(s, countlimit.WithClock(clock.Now))
	ctx := context.Background()
	api := countlimit.Rule{UseType: "api", Limit: 2, Window: countlimit.Fixed(time.Hour)}
	other := countlimit.Rule{UseType: "other", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	ban := countlimit.Rule{UseType: "ban", Limit: 0, Window: countlimit.Fixed(time.Hour), Block: time.Hour}

	type want struct {
		allowed bool
		used    int64
		full    bool
	}
	steps := []struct {
		name string
		do   func() (countlimit.Result, error)
		want want
	}{
		{"Allow a", func() (countlimit.Result, error) { return l.Allow(ctx, api, "a") }, want{true, 1, false}},
		{"Allow b", func() (countlimit.Result, error) { return l.Allow(ctx, api, "b") }, want{true, 1, false}},
		{"Allow c", func() (countlimit.Result, error) { return l.Allow(ctx, api, "c") }, want{true, 1, false}},
		{"Allow d, a fourth counter", func() (countlimit.Result, error) { return l.Allow(ctx, api, "d") }, want{false, 0, true}},
		{"Allow a again", func() (countlimit.Result, error) { return l.Allow(ctx, api, "a") }, want{true, 2, false}},
		{"Allow a over its limit", func() (countlimit.Result, error) { return l.Allow(ctx, api, "a") }, want{false, 2, false}},
		{"Refund a", func() (countlimit.Result, error) { return l.Refund(ctx, api, "a", 1) }, want{true, 1, false}},
		{"Peek d", func() (countlimit.Result, error) { return l.Peek(ctx, api, "d") }, want{true, 0, false}},
		{"Refund d", func() (countlimit.Result, error) { return l.Refund(ctx, api, "d", 1) }, want{true, 0, false}},
		// Denied anyway: answered as a denial, not an error a fail-open
		// policy would let through.
		{"Allow ban a, denied anyway", func() (countlimit.Result, error) { return l.Allow(ctx, ban, "a") }, want{false, 0, false}},
		{"AllowAll b with a new rule", func() (countlimit.Result, error) {
			res, err := l.AllowAll(ctx, "b", api, other)
			if err != nil {
				return countlimit.Result{}, err
			}
			return res[0], nil
		}, want{false, 0, true}},
		{"Peek b after the refused AllowAll", func() (countlimit.Result, error) { return l.Peek(ctx, api, "b") }, want{true, 1, false}},
		{"Allow b again", func() (countlimit.Result, error) { return l.Allow(ctx, api, "b") }, want{true, 2, false}},
		{"Reset c", func() (countlimit.Result, error) { return countlimit.Result{Allowed: true}, l.Reset(ctx, api, "c") }, want{true, 0, false}},
		{"Allow d, in c's room", func() (countlimit.Result, error) { return l.Allow(ctx, api, "d") }, want{true, 1, false}},
		{"Allow e", func() (countlimit.Result, error) { return l.Allow(ctx, api, "e") }, want{false, 0, true}},
	}
	for i, st := range steps {
		r, err := st.do()
		if st.want.full {
			if !isFull(err) {
				t.Errorf("step %d: %s: err = %v, want ErrFull and ErrUnavailable", i, st.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("step %d: %s: err = %v", i, st.name, err)
			continue
		}
		if r.Allowed != st.want.allowed || r.Used != st.want.used {
			t.Errorf("step %d: %s = Allowed %v, Used %d; want %v, %d", i, st.name, r.Allowed, r.Used, st.want.allowed, st.want.used)
		}
	}
	if r, err := l.Peek(ctx, ban, "a"); err != nil || !r.BlockedUntil.IsZero() {
		t.Errorf("Peek(ban, a) = %+v, %v; want no penalty: a full store keeps no new counter for a denial", r, err)
	}
	if n := s.Len(); n != 3 {
		t.Errorf("Len = %d, want 3", n)
	}
}

func TestFullStoreDropsExpiredCountersFirst(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithShards(1), memstore.WithMaxEntries(3), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s, countlimit.WithClock(storetest.NewClock(t0).Now))
	ctx := context.Background()
	live := countlimit.Rule{UseType: "live", Limit: 1, Window: countlimit.Fixed(time.Hour)}
	if _, err := l.Allow(ctx, live, "keep"); err != nil {
		t.Fatal(err)
	}
	memstore.Sweep(s)
	if memstore.MayHaveExpired(s, "live", "keep") {
		t.Error("with one counter an hour from expiry, the shard thinks one may have expired")
	}
	stale(t, l, "old-1")
	stale(t, l, "old-2")
	for i, id := range []string{"new-1", "new-2"} {
		if r, err := l.Allow(ctx, live, id); err != nil || !r.Allowed {
			t.Fatalf("step %d: Allow(%q) = %+v, %v; want allowed in an expired counter's room", i, id, r, err)
		}
	}
	if _, err := l.Allow(ctx, live, "new-3"); !isFull(err) {
		t.Fatalf("Allow(new-3) with three live counters: err = %v, want ErrFull", err)
	}
	if r, err := l.Peek(ctx, live, "keep"); err != nil || r.Used != 1 {
		t.Fatalf("Peek(keep) = %+v, %v; want Used 1: a live counter must never be evicted", r, err)
	}
}

// TestFullShardLooksInVainOnce: a full shard of live counters that looked
// for expired ones and found none refuses the next new ids without looking.
func TestFullShardLooksInVainOnce(t *testing.T) {
	t.Parallel()
	const rooms = 4 * memstore.SweepSlice // more than one look sees
	s := memstore.New(memstore.WithShards(1), memstore.WithMaxEntries(rooms), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	ctx := context.Background()
	// A counter that expires at once, then is gone: the shard still thinks
	// one may have expired.
	short := countlimit.Rule{UseType: "short", Limit: 1, Window: countlimit.Rolling(time.Microsecond)}
	if _, err := l.Allow(ctx, short, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(ctx, short, "gone"); err != nil {
		t.Fatal(err)
	}
	memstore.Elapse(s, memstore.ExpiryGrace) // and its grace is over
	live := countlimit.Rule{UseType: "live", Limit: 1, Window: countlimit.Fixed(time.Hour)}
	for i := range rooms {
		if _, err := l.Allow(ctx, live, fmt.Sprint("id-", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The first call that finds the shard full looks in vain and sets when
	// it may look again; the clock moves on between the calls, so a second
	// look would set a later time.
	var next int64
	for i := range 100 {
		if _, err := l.Allow(ctx, live, fmt.Sprint("new-", i)); !isFull(err) {
			t.Fatalf("Allow(new-%d) = %v, want ErrFull", i, err)
		}
		if i == 0 {
			next = memstore.NextLook(s, "live", "id-0")
		} else if got := memstore.NextLook(s, "live", "id-0"); got != next {
			t.Fatalf("Allow(new-%d) looked for expired counters again: the next look moved from %d to %d", i, next, got)
		}
		memstore.Elapse(s, time.Microsecond)
	}
}

// TestFullStoreConcurrent races many goroutines for the last rooms of a
// store while they count on a counter it already holds.
func TestFullStoreConcurrent(t *testing.T) {
	t.Parallel()
	const rooms, goroutines, each = 100, 50, 10
	s := memstore.New(memstore.WithShards(1), memstore.WithMaxEntries(rooms+1), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	ctx := context.Background()
	once := countlimit.Rule{UseType: "once", Limit: 1, Window: countlimit.Lifetime()}
	shared := countlimit.Rule{UseType: "shared", Limit: expose.MaxLimit, Window: countlimit.Lifetime()}
	if _, err := l.Allow(ctx, shared, "shared"); err != nil {
		t.Fatal(err)
	}
	var allowed, refused atomic.Int64
	var got sync.Map // id -> true when allowed
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("g%d-%d", g, i)
				r, err := l.Allow(ctx, once, id)
				switch {
				case err == nil && r.Allowed:
					allowed.Add(1)
					got.Store(id, true)
				case isFull(err):
					refused.Add(1)
				default:
					t.Errorf("Allow(%q) = %+v, %v; want allowed or ErrFull", id, r, err)
				}
				if _, err := l.Allow(ctx, shared, "shared"); err != nil {
					t.Errorf("Allow(shared) on a full store: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != rooms || refused.Load() != goroutines*each-rooms {
		t.Errorf("allowed %d, refused %d; want %d, %d", allowed.Load(), refused.Load(), rooms, goroutines*each-rooms)
	}
	for g := range goroutines {
		for i := range each {
			id := fmt.Sprintf("g%d-%d", g, i)
			want := int64(0)
			if _, ok := got.Load(id); ok {
				want = 1
			}
			if r, err := l.Peek(ctx, once, id); err != nil || r.Used != want {
				t.Errorf("Peek(%q) = Used %d, %v; want %d", id, r.Used, err, want)
			}
		}
	}
	if r, _ := l.Peek(ctx, shared, "shared"); r.Used != 1+goroutines*each {
		t.Errorf("shared Used = %d, want %d", r.Used, 1+goroutines*each)
	}
	if n := s.Len(); n != rooms+1 {
		t.Errorf("Len = %d, want %d", n, rooms+1)
	}
}

// TestMaxEntriesAcrossShards: each of 4 shards takes 10/4 rounded up, so
// the store takes 12 of many new ids, whichever shards they hash to.
func TestMaxEntriesAcrossShards(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithShards(4), memstore.WithMaxEntries(10), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: "api", Limit: 1, Window: countlimit.Lifetime()}
	allowed := 0
	for i := range 1000 {
		r, err := l.Allow(context.Background(), rule, fmt.Sprint("id-", i))
		switch {
		case err == nil && r.Allowed:
			allowed++
		case !isFull(err):
			t.Fatalf("Allow(id-%d) = %+v, %v", i, r, err)
		}
	}
	if allowed != 12 || s.Len() != 12 {
		t.Errorf("allowed %d, Len %d; want 12, 12", allowed, s.Len())
	}
}

func TestNoMaxEntries(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithShards(1), memstore.WithMaxEntries(0), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: "api", Limit: 1, Window: countlimit.Lifetime()}
	for i := range 5000 {
		if _, err := l.Allow(context.Background(), rule, fmt.Sprint("id-", i)); err != nil {
			t.Fatalf("Allow(id-%d): %v", i, err)
		}
	}
}

// BenchmarkAllowFullStore is the cost of refusing a new id when every
// counter is live: no scan, since none can have expired.
func BenchmarkAllowFullStore(b *testing.B) {
	s := memstore.New(memstore.WithShards(1), memstore.WithMaxEntries(10000), memstore.WithJanitorInterval(0))
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: 1, Window: countlimit.Fixed(time.Hour)}
	for i := range 10000 {
		if _, err := l.Allow(ctx, rule, fmt.Sprint("id-", i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, rule, "new"); !isFull(err) {
			b.Fatal(err)
		}
	}
}
