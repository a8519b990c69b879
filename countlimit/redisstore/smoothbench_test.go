package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// smoothRate is what both sides of the smooth benchmarks allow: 10 000 an
// hour with bursts of 10 000 (redis_rate.PerHour), room for every call.
const smoothRate = 10000

// BenchmarkSmoothVersusRedisRate runs, at 1, 4, 16 and 64 callers and
// through one client, go-redis/redis_rate's Allow and countlimit's Allow
// under a Smooth rule of the same rate and burst (both GCRA), over the
// same 10 000 ids, with no denials; as a yardstick, countlimit's Allow
// under a Fixed window of the same limit an hour; and, as the run's own
// bound on what it can tell apart, redis_rate's Allow a second time, on
// keys of its own (redis_rate again). Each side makes b.N calls, in 50
// rounds whose order turns (redis_rate, smooth, fixed, again; then the
// reverse, each time from the next side), so that the load of a shared
// machine, which drifts over seconds, weighs on all alike. It reports
// each side's calls/s, the smooth Allow's over redis_rate's
// (x-redis_rate) and over the fixed Allow's (x-fixed), and redis_rate
// again's over redis_rate's (aa-redis_rate): two copies of the same code,
// whose distance from 1.00 is how far the run's noise alone moves a ratio
// (run it with -benchtime Nx, N calls a side, say 20000x). At 1 and 4
// callers that is ±5% a run; BenchmarkSmoothVersusRedisRatePaired measures
// them call by call, to about 1%.
func BenchmarkSmoothVersusRedisRate(b *testing.B) {
	c, l, theirs, smooth := smoothSides(b, "smooth")
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	fixed := countlimit.Rule{UseType: countlimit.UseType("bench.smoothfixed." + run), Limit: 1 << 40, Window: countlimit.Fixed(time.Hour)}
	again := countlimit.UseType("bench.smoothagain." + run)
	b.Cleanup(func() {
		deleteMatching(b, c, redisstore.Key(fixed.UseType, "*"))
		deleteMatching(b, c, "rate:"+string(again)+":*")
	})
	theirsAgain := rateAllowOf(redis_rate.NewLimiter(c), string(again), redis_rate.PerHour(smoothRate))
	for _, callers := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			const rounds = 50
			sides := [...]func(string) error{theirs, smooth, allowOf(l, fixed), theirsAgain}
			var spent [len(sides)]time.Duration
			var next int64 // the ids go on from round to round
			b.ResetTimer()
			for r := range rounds {
				calls := b.N / rounds
				if r < b.N%rounds {
					calls++
				}
				for k := range len(sides) {
					side := (r + k) % len(sides)
					if r%2 == 1 {
						side = (r + len(sides) - k) % len(sides)
					}
					start := time.Now()
					next = callOver(b, callers, next, calls, sides[side])
					spent[side] += time.Since(start)
				}
			}
			b.StopTimer()
			perSecond := func(side int) float64 { return float64(b.N) / spent[side].Seconds() }
			rate, cl, fx, aa := perSecond(0), perSecond(1), perSecond(2), perSecond(3)
			b.ReportMetric(rate, "redis_rate-calls/s")
			b.ReportMetric(cl, "smooth-calls/s")
			b.ReportMetric(fx, "fixed-calls/s")
			b.ReportMetric(cl/rate, "x-redis_rate")
			b.ReportMetric(cl/fx, "x-fixed")
			b.ReportMetric(aa/rate, "aa-redis_rate")
		})
	}
}

// BenchmarkSmoothVersusRedisRatePaired compares the smooth Allow with
// redis_rate's at 1 and 4 callers, where every call is a round trip of its
// own on either side, call by call instead of in rounds: each caller makes,
// on each of its ids in turn, one call of each of two sides, the order
// turning from id to id, and times each. The machine's drift, which moves a
// round of 400 calls by several percent, then lands on both sides within a
// few hundred microseconds. Only two sides go together: a call runs faster
// after one that ran the same code (its caches are warm), so a third side
// that shares code with one of them (redis_rate a second time, say) would
// favour it, by 1-2% here. Three pairs run one after the other, each
// redis_rate against: the smooth Allow (x-redis_rate); the Store's
// fast.lua command for the same call alone, sent as the Store sends a call
// that goes alone and decoded, without the Limiter or the Batcher
// (script-redis_rate: Redis and the round trip apart from the client's
// path); and redis_rate's Allow again on keys of its own
// (aa-redis_rate: how far noise moves a ratio in this run). Each ratio is
// redis_rate's time a call over the other side's: above 1, the other side
// is quicker, as x-redis_rate in the benchmark in rounds.
func BenchmarkSmoothVersusRedisRatePaired(b *testing.B) {
	c, _, theirs, smooth := smoothSides(b, "paired")
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	again, alone := "bench.pairedagain."+run, "bench.pairedscript."+run
	b.Cleanup(func() {
		deleteMatching(b, c, "rate:"+again+":*")
		deleteMatching(b, c, redisstore.Key(countlimit.UseType(alone), "*"))
	})
	theirsAgain := rateAllowOf(redis_rate.NewLimiter(c), again, redis_rate.PerHour(smoothRate))
	s := redisstore.New(c)
	ctx := context.Background()
	script := func(id string) error {
		now := time.Now().Truncate(time.Microsecond)
		r := &driver.Request{Op: driver.OpAllow, ID: id, Now: now, N: 1, Checks: []driver.Check{{
			UseType: alone, Limit: smoothRate, Interval: time.Hour / smoothRate, Burst: smoothRate, Kind: "smooth"}}}
		if err := s.FastForTest(ctx, r); err != nil {
			return err
		}
		if !r.Checks[0].State.Allowed {
			return fmt.Errorf("%s: denied", id)
		}
		return nil
	}
	for _, callers := range []int{1, 4} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			b.ResetTimer()
			for _, other := range []struct {
				name string
				call func(string) error
			}{{"x", smooth}, {"script", script}, {"aa", theirsAgain}} {
				spent := interleaved(b, callers, theirs, other.call)
				b.ReportMetric(float64(spent[0])/float64(spent[1]), other.name+"-redis_rate")
				if other.name == "x" {
					b.ReportMetric(float64(spent[0].Microseconds())/float64(b.N), "redis_rate-µs/call")
					b.ReportMetric(float64(spent[1].Microseconds())/float64(b.N), "smooth-µs/call")
				}
			}
		})
	}
}

// interleaved makes b.N calls of each of two sides from callers
// goroutines, each of them making one call of each side on each of its
// ids in turn, in an order that turns from id to id, and returns the time
// the calls of each side took, summed.
func interleaved(b *testing.B, callers int, sides ...func(id string) error) (spent [2]time.Duration) {
	b.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range callers {
		per := (b.N + callers - 1 - g) / callers // b.N in all
		wg.Go(func() {
			var mine [2]time.Duration
			for i := range per {
				id := versusIDs[(g+callers*i)%len(versusIDs)]
				for k := range 2 {
					side := (i + k) % 2
					start := time.Now()
					if err := sides[side](id); err != nil {
						b.Error(err)
						return
					}
					mine[side] += time.Since(start)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			spent[0] += mine[0]
			spent[1] += mine[1]
		})
	}
	wg.Wait()
	return spent
}

// smoothSides returns, on a new client c, go-redis/redis_rate's Allow
// (theirs) and the Allow of a Limiter l under a Smooth rule of the same
// rate and burst (ours): smoothRate an hour, bursts of smoothRate, each
// failing on a denial, under use types of their own (bench.<name>.<run>),
// whose keys go when b ends.
func smoothSides(b *testing.B, name string) (c *redis.Client, l *countlimit.Limiter, theirs, ours func(id string) error) {
	c = client(b)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	rr := redis_rate.NewLimiter(c)
	perHour := redis_rate.PerHour(smoothRate)
	l = countlimit.New(redisstore.New(c))
	rule := countlimit.Rule{UseType: countlimit.UseType("bench." + name + "." + run), Limit: smoothRate, Window: countlimit.Smooth(time.Hour, smoothRate)}
	b.Cleanup(func() {
		deleteMatching(b, c, "rate:"+string(rule.UseType)+":*")
		deleteMatching(b, c, redisstore.Key(rule.UseType, "*"))
	})
	theirs = rateAllowOf(rr, string(rule.UseType), perHour)
	ours = allowOf(l, rule)
	return c, l, theirs, ours
}

// callOver makes calls calls of call from callers goroutines, each on the
// next of versusIDs from first on, and returns where the ids stopped.
func callOver(b *testing.B, callers int, first int64, calls int, call func(id string) error) int64 {
	b.Helper()
	var next atomic.Int64
	next.Store(first)
	last := first + int64(calls)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > last {
					return
				}
				if err := call(versusIDs[i%int64(len(versusIDs))]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return last
}

// BenchmarkSmoothMemoryVersusRedisRate measures what Redis keeps per key
// under a Smooth rule and under go-redis/redis_rate, same rate and burst
// (100 an hour, bursts of 100: three calls keep a key 108 s, past the
// measurement; at 10 000 an hour it would drain, and go, in about a
// second), once each of the 10 000 ids has been allowed three times on
// each side: MEMORY USAGE (SAMPLES 0) summed
// over every key, per key (B/key-countlimit, B/key-redis_rate), and
// INFO memory's used_memory, but for its clients' buffers, before and
// after each side's calls, per key (B/key-used-*). redis_rate's keys are
// "rate:" and the same use type and id countlimit's hold
// ("countlimit:<use type>:{<id>}"), so they differ only by the prefix and
// the braces of the hash tag. Run it with -benchtime 1x against a Redis
// that nothing else uses (used_memory is the server's); 20 000 keys of
// its own, with TTLs, size the key tables first, as in
// BenchmarkMemoryVersusRedisRate.
func BenchmarkSmoothMemoryVersusRedisRate(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	filler := "countlimit-bench:filler:" + run + ":"
	p := c.Pipeline()
	for i := range 20000 {
		p.Set(ctx, filler+strconv.Itoa(i), "x", time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteMatching(b, c, filler+"*") })
	ut := countlimit.UseType("bench.smoothmem." + run)
	rule := countlimit.Rule{UseType: ut, Limit: 100, Window: countlimit.Smooth(time.Hour, 100)}
	l := countlimit.New(redisstore.New(c))
	rr := redis_rate.NewLimiter(c)
	perHour := redis_rate.PerHour(100)
	// phase calls each id three times, from 16 callers, and returns the
	// bytes of used_memory it added and the MEMORY USAGE of the keys
	// matching pattern, summed, with their count; the keys are deleted
	// after.
	phase := func(pattern string, call func(id string) error) (used, usage, keys int64) {
		mem, _ := memoryOf(b, c)
		ids := make([]string, 0, 3*len(versusIDs))
		for range 3 {
			ids = append(ids, versusIDs...)
		}
		runOver(b, 16, ids, call)
		mem1, _ := memoryOf(b, c)
		var cmds []redis.Cmder
		q := c.Pipeline()
		for it := c.Scan(ctx, 0, pattern, 1000).Iterator(); it.Next(ctx); {
			cmds = append(cmds, q.MemoryUsage(ctx, it.Val(), 0))
		}
		if _, err := q.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		for _, cmd := range cmds {
			usage += cmd.(*redis.IntCmd).Val()
		}
		deleteMatching(b, c, pattern)
		return mem1 - mem, usage, int64(len(cmds))
	}
	for range b.N {
		clUsed, clUsage, clKeys := phase(redisstore.Key(ut, "*"), allowOf(l, rule))
		rrUsed, rrUsage, rrKeys := phase("rate:"+string(ut)+":*", rateAllowOf(rr, string(ut), perHour))
		if clKeys != int64(len(versusIDs)) || rrKeys != int64(len(versusIDs)) {
			b.Fatalf("%d keys on countlimit's side and %d on redis_rate's, want %d each", clKeys, rrKeys, len(versusIDs))
		}
		b.ReportMetric(float64(clUsage)/float64(clKeys), "B/key-countlimit")
		b.ReportMetric(float64(rrUsage)/float64(rrKeys), "B/key-redis_rate")
		b.ReportMetric(float64(clUsage)/float64(rrUsage), "x-redis_rate-usage")
		b.ReportMetric(float64(clUsed)/float64(clKeys), "B/key-used-countlimit")
		b.ReportMetric(float64(rrUsed)/float64(rrKeys), "B/key-used-redis_rate")
		b.ReportMetric(float64(clUsed)/float64(rrUsed), "x-redis_rate-used")
	}
}

// runOver calls call for each of ids, from callers goroutines.
func runOver(b *testing.B, callers int, ids []string, call func(id string) error) {
	b.Helper()
	next := make(chan string)
	done := make(chan struct{})
	for range callers {
		go func() {
			defer func() { done <- struct{}{} }()
			for id := range next {
				if err := call(id); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	for range callers {
		<-done
	}
}

// replayHook answers every script after the first of its reply type with
// that first reply, without the network: what is left of a call is the
// client's own work, the Limiter's, the Store's and go-redis's.
type replayHook struct {
	slice []int64 // the first *redis.IntSliceCmd's reply (countlimit's scripts)
	val   any     // the first *redis.Cmd's (redis_rate's script)
}

func (h *replayHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *replayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch c := cmd.(type) {
		case *redis.IntSliceCmd:
			if h.slice == nil {
				err := next(ctx, cmd)
				h.slice = c.Val()
				return err
			}
			c.SetVal(append([]int64(nil), h.slice...)) // as go-redis makes one a reply
		case *redis.Cmd:
			if h.val == nil {
				err := next(ctx, cmd)
				h.val = c.Val()
				return err
			}
			c.SetVal(h.val)
		default:
			return next(ctx, cmd)
		}
		return nil
	}
}

func (h *replayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// BenchmarkSmoothClientCostVersusRedisRate is the client's side alone of
// BenchmarkSmoothVersusRedisRate at one caller: each side's Allow over the
// same ids, its first call answered by Redis and every later one by a hook
// that hands back that first reply (replayHook), so nothing is written to
// a socket and ns/op and allocs/op are the Go a call costs on the client,
// the same from run to run where the round trip's wall time is not. Both
// sides go through go-redis's Process and its hooks alike.
func BenchmarkSmoothClientCostVersusRedisRate(b *testing.B) {
	c, _, theirs, ours := smoothSides(b, "smoothclient")
	c.AddHook(&replayHook{}) // one hook for both: their replies differ in type
	for _, side := range []struct {
		name  string
		allow func(id string) error
	}{{"redis_rate", theirs}, {"countlimit", ours}} {
		b.Run("side="+side.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := side.allow(versusIDs[i%len(versusIDs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
