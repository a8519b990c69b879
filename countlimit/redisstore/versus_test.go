package redisstore_test

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// versusIDs are the ids both sides count: as many as a service's active
// users in a minute, so that pipelines carry different ids.
var versusIDs = func() []string {
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = fmt.Sprintf("user-%05d", i)
	}
	return ids
}()

// runCallersOver is runCallers over ids: each of callers goroutines calls
// the next id in turn. It returns the wall time per call in ns and
// reports calls/s.
func runCallersOver(b *testing.B, callers int, ids []string, call func(id string) error) float64 {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := call(ids[i%int64(len(ids))]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	ns := float64(elapsed.Nanoseconds()) / float64(b.N)
	b.ReportMetric(1e9/ns, "calls/s")
	return ns
}

// BenchmarkVersusRedisRate runs, at 1, 4, 16 and 64 callers and through
// one client (so with the same options), the bare INCR+PEXPIRE script,
// go-redis/redis_rate's Allow (GCRA, one script a call, no pipelining) and
// countlimit's Allow of a fixed window, in that order, over the same 10 000
// ids, with room for every call on both sides (10 000 an hour: no
// denials). The Allow rows report their calls/s over redis_rate's
// (x-redis_rate) and over the bare script's (x-bare), both measured just
// before in the same run. The sides run one after the other, not in
// rounds (-count repeats each before the next starts), so their ratio
// carries the machine's drift between them; BenchmarkSmoothVersusRedisRate
// runs the fixed window and redis_rate in alternated rounds.
func BenchmarkVersusRedisRate(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	// Keys of their own each time the benchmark runs.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	rr := redis_rate.NewLimiter(c)
	perHour := redis_rate.PerHour(10000)
	l := countlimit.New(redisstore.New(c))
	rule := countlimit.Rule{UseType: countlimit.UseType("bench.versus." + run), Limit: 10000, Window: countlimit.Fixed(time.Hour)}
	incr := redis.NewScript(incrSrc)
	if err := incr.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, p := range []string{"countlimit-bench:" + run + ":*", "rate:" + run + ":*", redisstore.Key(rule.UseType, "*")} {
			deleteMatching(b, c, p)
		}
	})
	for _, callers := range []int{1, 4, 16, 64} {
		var bareNs, rateNs float64
		b.Run(fmt.Sprintf("callers=%d/bare_INCR+PEXPIRE", callers), func(b *testing.B) {
			bareNs = runCallersOver(b, callers, versusIDs, func(id string) error {
				return incr.EvalSha(ctx, c, []string{"countlimit-bench:" + run + ":" + id}, 3600000).Err()
			})
		})
		b.Run(fmt.Sprintf("callers=%d/redis_rate", callers), func(b *testing.B) {
			rateNs = runCallersOver(b, callers, versusIDs, rateAllowOf(rr, run, perHour))
		})
		b.Run(fmt.Sprintf("callers=%d/Allow", callers), func(b *testing.B) {
			ns := runCallersOver(b, callers, versusIDs, allowOf(l, rule))
			b.ReportMetric(rateNs/ns, "x-redis_rate")
			b.ReportMetric(bareNs/ns, "x-bare")
		})
	}
}

var memoryFor = flag.Duration("memory.for", 20*time.Second, "BenchmarkMemoryVersusRedisRate: how long each side runs")

// BenchmarkMemoryVersusRedisRate measures what Redis holds (INFO memory's
// used_memory, but for its clients' buffers, and DBSIZE, read before and
// after) once 16 and 64 callers have called Allow for -memory.for (20 s)
// over the same 10 000 ids, 1 000 an hour on both sides (room for every
// call; a redis_rate key lives as long as its calls' share of the hour,
// 3.6 s a call, so it outlives the run, and countlimit's until the hour
// ends): countlimit's Allow,
// the same with the lost-reply records off (WithUnguarded: no field r), and
// redis_rate's. It reports the bytes and keys each leaves (B-countlimit,
// keys-countlimit: one a counter, when no write keeps a key of its own;
// B-records-off; B-redis_rate, keys-redis_rate), what the records take
// (B-records, the difference) over what the counters take without them
// (records/counters), and countlimit's bytes over redis_rate's. used_memory
// is the server's: run it with -benchtime 1x against a Redis of its own,
// which nothing else uses. 20 000 keys of its own, with TTLs, size the
// server's key tables before it starts, so that no phase's figure holds a
// table's growth or shrinking (8 bytes a slot, two tables: one side would
// otherwise be charged for the other's keys).
func BenchmarkMemoryVersusRedisRate(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	filler := "countlimit-bench:filler:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	p := c.Pipeline()
	for i := range 20000 {
		p.Set(ctx, filler+strconv.Itoa(i), "x", time.Hour)
	}
	if _, err := p.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteMatching(b, c, filler+"*") })
	for _, callers := range []int{16, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			run := strconv.FormatInt(time.Now().UnixNano(), 36)
			l := countlimit.New(redisstore.New(c))
			lOff := countlimit.New(redisstore.New(c, redisstore.WithUnguarded()))
			// phase returns the bytes and keys a run of call leaves, and
			// the calls it made; the keys matching pattern are deleted
			// after.
			phase := func(pattern string, call func(id string) error) (bytes, keys, calls int64) {
				mem, n := memoryOf(b, c)
				calls = callFor(b, callers, *memoryFor, call)
				mem1, n1 := memoryOf(b, c)
				deleteMatching(b, c, pattern)
				return mem1 - mem, n1 - n, calls
			}
			allow := func(l *countlimit.Limiter, ut countlimit.UseType) (bytes, keys, calls int64) {
				rule := countlimit.Rule{UseType: ut, Limit: 1000, Window: countlimit.Fixed(time.Hour)}
				return phase(redisstore.Key(rule.UseType, "*"), allowOf(l, rule))
			}
			// A first run, not measured: the first phase after the server
			// took the filler keys now and then read more memory than the
			// same phase run later.
			allow(l, countlimit.UseType("bench.memory.warm."+run))
			cl, keys, calls := allow(l, countlimit.UseType("bench.memory."+run))
			off, _, _ := allow(lOff, countlimit.UseType("bench.memory.off."+run))
			rr := redis_rate.NewLimiter(c)
			perHour := redis_rate.PerHour(1000)
			rate, rateKeys, rateCalls := phase("rate:"+run+":*", rateAllowOf(rr, run, perHour))
			b.ReportMetric(float64(cl), "B-countlimit")
			b.ReportMetric(float64(keys), "keys-countlimit")
			b.ReportMetric(float64(off), "B-records-off")
			b.ReportMetric(float64(cl-off), "B-records")
			b.ReportMetric(float64(cl-off)/float64(off), "records/counters")
			b.ReportMetric(float64(rate), "B-redis_rate")
			b.ReportMetric(float64(rateKeys), "keys-redis_rate")
			b.ReportMetric(float64(cl)/float64(rate), "x-redis_rate-bytes")
			b.ReportMetric(float64(calls)/memoryFor.Seconds(), "calls/s")
			b.ReportMetric(float64(rateCalls)/memoryFor.Seconds(), "redis_rate-calls/s")
		})
	}
}

// callFor runs call from callers goroutines over versusIDs for d and
// returns how many calls it made.
func callFor(b *testing.B, callers int, d time.Duration, call func(id string) error) int64 {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for range callers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if err := call(versusIDs[next.Add(1)%int64(len(versusIDs))]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return next.Load()
}

// memoryOf returns the server's used_memory but for what its clients
// take (their buffers grow and shrink with the callers, not the keys), and
// the DB's key count, read once the server has settled: for a second after
// a run its used_memory still moves by a few hundred kB as it trims what
// the run's clients left.
func memoryOf(b *testing.B, c *redis.Client) (used, keys int64) {
	b.Helper()
	ctx := context.Background()
	time.Sleep(2 * time.Second)
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "used_memory":
			used += n
		case "mem_clients_normal", "mem_clients_slaves":
			used -= n
		}
	}
	keys, err = c.DBSize(ctx).Result()
	if err != nil {
		b.Fatal(err)
	}
	return used, keys
}

// deleteMatching deletes the keys matching pattern.
func deleteMatching(b testing.TB, c *redis.Client, pattern string) {
	b.Helper()
	eachMatching(b, c, pattern, func(p redis.Pipeliner, key string) { p.Del(context.Background(), key) })
}

// eachMatching calls do for each key matching pattern, in pipelines.
func eachMatching(b testing.TB, c *redis.Client, pattern string, do func(p redis.Pipeliner, key string)) {
	b.Helper()
	ctx := context.Background()
	p := c.Pipeline()
	for it := c.Scan(ctx, 0, pattern, 1000).Iterator(); it.Next(ctx); {
		do(p, it.Val())
		if p.Len() == 1000 {
			if _, err := p.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := p.Exec(ctx); err != nil {
		b.Fatal(err)
	}
}

// allowOf is l's Allow under rule, as a benchmark's call: a denial fails it.
func allowOf(l *countlimit.Limiter, rule countlimit.Rule) func(id string) error {
	return func(id string) error {
		res, err := l.Allow(context.Background(), rule, id)
		if err == nil && !res.Allowed {
			err = fmt.Errorf("countlimit denied %s", id)
		}
		return err
	}
}

// rateAllowOf is go-redis/redis_rate's Allow of "<prefix>:<id>" under
// limit, as a benchmark's call: a denial fails it.
func rateAllowOf(rr *redis_rate.Limiter, prefix string, limit redis_rate.Limit) func(id string) error {
	return func(id string) error {
		res, err := rr.Allow(context.Background(), prefix+":"+id, limit)
		if err == nil && res.Allowed != 1 {
			err = fmt.Errorf("redis_rate denied %s", id)
		}
		return err
	}
}
