package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

func TestSweepRebuildsEmptiedShards(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithShards(4), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	for i := range 20000 {
		stale(t, l, fmt.Sprint("id-", i))
	}
	if n, p := s.Len(), memstore.Peak(s); n != 20000 || p != 20000 {
		t.Fatalf("Len %d, peak %d; want 20000, 20000", n, p)
	}
	rebuilt := memstore.Sweep(s)
	if n := s.Len(); n != 0 {
		t.Errorf("Len = %d after the sweep, want 0", n)
	}
	if rebuilt != 4 {
		t.Errorf("%d shard maps rebuilt, want all 4", rebuilt)
	}
	if p := memstore.Peak(s); p != 0 {
		t.Errorf("peak = %d after the rebuild, want 0: the maps are fresh", p)
	}
	if got := memstore.Sweep(s); got != 0 {
		t.Errorf("%d shard maps rebuilt by a second sweep, want none: empty fresh maps need none", got)
	}
}

func TestSweepKeepsShardsThatShrankLittle(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithShards(1), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: "live", Limit: 1, Window: countlimit.Fixed(time.Hour)}
	for i := range 3000 {
		if i%2 == 0 {
			stale(t, l, fmt.Sprint("id-", i))
		} else if _, err := l.Allow(context.Background(), rule, fmt.Sprint("id-", i)); err != nil {
			t.Fatal(err)
		}
	}
	r := memstore.Sweep(s)
	if n := s.Len(); n != 1500 || r != 0 {
		t.Errorf("Len %d, %d rebuilt; want 1500, 0: half the peak left is not worth a rebuild", n, r)
	}
}

// TestSweepMovesLiveCounters rebuilds a shard while counters are checked,
// added and reset between the sweep's slices: every count must survive the
// move exactly.
func TestSweepMovesLiveCounters(t *testing.T) {
	t.Parallel()
	const stales, lives = 20000, 3000 // a rebuild moves lives in several slices
	s := memstore.New(memstore.WithShards(1), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "live", Limit: expose.MaxLimit, Window: countlimit.Lifetime()}
	want := map[string]int64{}
	allow := func(id string) {
		t.Helper()
		if _, err := l.Allow(ctx, rule, id); err != nil {
			t.Error(err)
			return
		}
		want[id]++
	}
	for i := range stales {
		stale(t, l, fmt.Sprint("stale-", i))
	}
	for i := range lives {
		allow(fmt.Sprint("live-", i))
	}
	pauses := 0
	pause := func() {
		pauses++
		for i := range 50 { // counters in the old map, the new one, or neither
			allow(fmt.Sprint("live-", (pauses*97+i*61)%lives))
		}
		allow(fmt.Sprint("added-", pauses))
		id := fmt.Sprint("live-", pauses*13%lives)
		if err := l.Reset(ctx, rule, id); err != nil {
			t.Error(err)
		}
		delete(want, id)
	}
	rebuilt := memstore.SweepPausing(s, pause)
	if got := rebuilt; got != 1 {
		t.Fatalf("%d rebuilt, want 1", got)
	}
	if pauses < (stales+lives)/memstore.SweepSlice+lives/memstore.SweepSlice-1 {
		t.Errorf("%d pauses, want a pause every %d counters", pauses, memstore.SweepSlice)
	}
	if n := s.Len(); n != len(want) {
		t.Errorf("Len = %d, want %d", n, len(want))
	}
	for id, used := range want {
		if r, err := l.Peek(ctx, rule, id); err != nil || r.Used != used {
			t.Errorf("Peek(%q) = Used %d, %v; want %d", id, r.Used, err, used)
		}
	}
}

// TestSweepMissesNoExpiry adds expired counters while a sweep pauses: those
// the sweep had already passed must still tell a full shard to look.
func TestSweepMissesNoExpiry(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithShards(1), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: "live", Limit: 1, Window: countlimit.Lifetime()}
	const lives = 8 * memstore.SweepSlice
	for i := range lives {
		if _, err := l.Allow(context.Background(), rule, fmt.Sprint("live-", i)); err != nil {
			t.Fatal(err)
		}
	}
	pauses := 0
	pause := func() {
		pauses++
		stale(t, l, fmt.Sprint("stale-", pauses))
	}
	memstore.SweepPausing(s, pause)
	kept := s.Len() - lives
	t.Logf("%d of %d expired counters added during the sweep outlived it", kept, pauses)
	if got := memstore.MayHaveExpired(s, "live", "live-0"); got != (kept > 0) {
		t.Errorf("after the sweep, with %d expired counters kept, the shard thinks one may have expired: %v", kept, got)
	}
}

// TestSweepLetsGoOfTheLock sweeps a shard of 200k expired counters and, at
// every pause, has another goroutine count on that shard: the sweep must
// have let go of the lock for it to finish.
func TestSweepLetsGoOfTheLock(t *testing.T) {
	t.Parallel()
	const n = 200_000
	s := memstore.New(memstore.WithShards(1), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	ctx := context.Background()
	for i := range n {
		stale(t, l, strconv.Itoa(i))
	}
	rule := countlimit.Rule{UseType: "live", Limit: expose.MaxLimit, Window: countlimit.Lifetime()}
	var during atomic.Int64
	pause := func() {
		if memstore.ShardLocked(s, "live", "live") {
			t.Error("paused with the shard's lock held")
			return
		}
		done := make(chan error)
		go func() {
			_, err := l.Allow(ctx, rule, "live")
			done <- err
		}()
		if err := <-done; err != nil {
			t.Error(err)
		}
		during.Add(1)
	}
	memstore.SweepPausing(s, pause)
	if got := during.Load(); got < n/memstore.SweepSlice {
		t.Errorf("%d checks ran during the sweep, want one per slice: %d", got, n/memstore.SweepSlice)
	}
	if r, _ := l.Peek(ctx, rule, "live"); r.Used != during.Load() {
		t.Errorf("Used = %d, want %d", r.Used, during.Load())
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len = %d after the sweep, want 1", got)
	}
}

// TestSweepWhileCounting sweeps and rebuilds over and over while many
// goroutines count on live counters and add expired ones.
func TestSweepWhileCounting(t *testing.T) {
	t.Parallel()
	const goroutines, each, keys = 8, 2000, 4
	s := memstore.New(memstore.WithShards(2), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "live", Limit: expose.MaxLimit, Window: countlimit.Lifetime()}
	for i := range 10000 { // the first sweep will rebuild both shards
		stale(t, l, fmt.Sprint("pre-", i))
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for i := range each {
				if _, err := l.Allow(ctx, rule, fmt.Sprint("key-", (g+i)%keys)); err != nil {
					t.Error(err)
					return
				}
				stale(t, l, fmt.Sprintf("churn-%d-%d", g, i))
			}
		})
	}
	stop := make(chan struct{})
	swept := make(chan struct{})
	rebuilt := 0
	go func() {
		defer close(swept)
		<-start
		for {
			rebuilt += memstore.Sweep(s)
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	close(start)
	wg.Wait()
	close(stop)
	<-swept
	rebuilt += memstore.Sweep(s)
	for k := range keys {
		id := fmt.Sprint("key-", k)
		if r, err := l.Peek(ctx, rule, id); err != nil || r.Used != goroutines*each/keys {
			t.Errorf("Peek(%q) = Used %d, %v; want %d", id, r.Used, err, goroutines*each/keys)
		}
	}
	if n := s.Len(); n != keys {
		t.Errorf("Len = %d after the last sweep, want %d", n, keys)
	}
	if rebuilt == 0 {
		t.Error("no shard was rebuilt")
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMemory reports the heap one counter takes (with a fresh id
// string, as a server's would be), short ids and 512-byte ones, beside
// what the store accounts for it (see WithMaxBytes), what stays after
// every counter has expired and been swept, how long the sweep took and
// about how long it held a shard's lock per slice (wall time: on a busy
// machine the scheduler's preemptions show in the tail). Run it with
// -benchtime=1000000x for a million ids.
func BenchmarkMemory(b *testing.B) {
	for _, tc := range []struct {
		name string
		id   func(int) string
	}{
		{"id=short", func(i int) string { return "user-" + strconv.Itoa(i) }},
		{"id=512B", longID},
	} {
		b.Run(tc.name, func(b *testing.B) { benchmarkMemory(b, tc.id) })
	}
}

func benchmarkMemory(b *testing.B, id func(int) string) {
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: 10, Window: countlimit.Rolling(time.Microsecond)}
	before := heapAlloc()
	s := memstore.New(memstore.WithMaxBytes(0), memstore.WithJanitorInterval(0))
	defer s.Close()
	l := countlimit.New(s)
	for i := range b.N {
		if _, err := l.Allow(ctx, rule, id(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	full := heapAlloc()
	accounted := s.Bytes()
	var holds []time.Duration // between pauses: about how long each slice held its lock
	last := time.Now()
	pause := func() {
		holds = append(holds, time.Since(last))
		last = time.Now()
	}
	start := time.Now()
	memstore.SweepPausing(s, pause)
	sweep := time.Since(start)
	if n := s.Len(); n != 0 {
		b.Fatalf("Len = %d after a sweep, want 0", n)
	}
	empty := heapAlloc()
	b.ReportMetric(float64(full-before)/float64(b.N), "B/id")
	b.ReportMetric(float64(accounted)/float64(b.N), "B/id-accounted")
	b.ReportMetric(float64(empty-before)/float64(b.N), "B/id-swept")
	b.ReportMetric(float64(empty-before)/1e6, "MB-swept")
	b.ReportMetric(float64(sweep.Microseconds()), "µs/sweep")
	if len(holds) > 0 {
		slices.Sort(holds)
		b.ReportMetric(float64(holds[len(holds)/2].Microseconds()), "µs/slice-p50")
		b.ReportMetric(float64(holds[len(holds)*99/100].Microseconds()), "µs/slice-p99")
	}
	runtime.KeepAlive(s)
}

// TestStaleCheckAfterSweepKeepsCount: a check whose clock was read before
// its window or penalty ended, and that reaches the store after a sweep
// that ran once it had ended, still finds what was counted, as
// redisstore's TestClockBehindRedisKeepsCounts holds Redis's keys to.
// Dropped at the end, the counter would be counted from zero in a window
// that was full, and a penalty would start over.
func TestStaleCheckAfterSweepKeepsCount(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	clock := storetest.NewClock(t0)
	l := countlimit.New(s, countlimit.WithClock(clock.Now))
	ctx := context.Background()
	// Every window and penalty ends a minute after t0. The late check's
	// clock reads 250ms before that; the store's monotonic clock is 250ms
	// past it when the sweep runs: a check 500ms stale, inside the grace.
	const window, early = time.Minute, 250 * time.Millisecond
	if 2*early >= memstore.ExpiryGrace {
		t.Fatalf("a check %v stale is not covered by the grace of %v", 2*early, memstore.ExpiryGrace)
	}
	rules := []countlimit.Rule{
		{UseType: "stale.fixed", Limit: 1, Window: countlimit.Fixed(window)},
		{UseType: "stale.rolling", Limit: 1, Window: countlimit.Rolling(window)},
		{UseType: "stale.sliding", Limit: 1, Window: countlimit.Sliding(window)},
		{UseType: "stale.smooth", Limit: 1, Window: countlimit.Smooth(window, 1)},
		// Nothing fits: the first call's denial earns the penalty.
		{UseType: "stale.penalty", Limit: 0, Window: countlimit.Rolling(time.Hour), Block: window},
	}
	// Each rule alone on one id, all of them on another (AllowAll): one
	// allowed, one denied; the penalty's first denial.
	blocked := map[string]time.Time{} // by id
	for _, r := range rules {
		for _, id := range []string{"one", "all"} {
			for call := range 2 {
				if r.Limit == 0 && call == 0 {
					continue
				}
				res, err := l.Allow(ctx, r, id)
				if err != nil || res.Allowed != (call == 0) {
					t.Fatalf("%s: call %d on %s: %+v, %v", r.UseType, call+1, id, res, err)
				}
				if r.Block > 0 {
					blocked[id] = res.BlockedUntil
				}
			}
		}
	}
	clock.Set(t0.Add(window - early))
	memstore.Elapse(s, window+early)
	memstore.Sweep(s)
	// Denied, by what the first calls stored: the count, or the penalty
	// they set (a counter gone, a new denial would set a later one).
	seen := func(r countlimit.Rule, id string, res countlimit.Result) bool {
		if r.Block > 0 {
			return res.BlockedUntil.Equal(blocked[id])
		}
		return res.Used == 1
	}
	for _, r := range rules {
		res, err := l.Allow(ctx, r, "one")
		if err != nil || res.Allowed || !seen(r, "one", res) {
			t.Errorf("%s: a check %v stale, after a sweep: %+v, %v; want a denial by what is stored", r.UseType, 2*early, res, err)
		}
	}
	res, err := l.AllowAll(ctx, "all", rules...)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Allowed || !seen(rules[i], "all", r) {
			t.Errorf("AllowAll, %s: a check %v stale, after a sweep: %+v; want a denial by what is stored", rules[i].UseType, 2*early, r)
		}
	}
}
