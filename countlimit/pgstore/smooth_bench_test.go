package pgstore_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// BenchmarkSmooth compares, at 1 and 16 concurrent callers over 256 ids
// whose rows exist (counted once and analyzed before the clock starts):
//
//   - upsert: the hand-written fixed-window upsert bench --baseline
//     measures Allow against (cli's baselineUpsert, on its 4-column table);
//   - fixed@v0.1.0: Allow of a fixed window on a schema at migration 1
//     (v0.1.0), before v0.2.0's 00002_v0_2_0.sql;
//   - fixed@head: the same on a schema at the latest migration;
//   - smooth@head: Allow of a smooth window (countlimit_apply, one
//     statement and commit per call: smooth checks are never batched).
//
// Run the variants in one invocation, several times over (-count), and
// compare their medians: docs/benchmarks.md has the command and a run.
func BenchmarkSmooth(b *testing.B) { benchSmooth(b, false) }

// BenchmarkSmoothInterleaved is BenchmarkSmooth's variants measured in
// one run, alternated so that the machine's load falls on each alike:
// rounds of smoothCell each, in the order upsert, fixed@v0.1.0,
// fixed@head, smooth@head, then backwards, and so on (ABCD DCBA ...), at
// 1 and at 16 callers. It runs once whatever b.N (run it with -benchtime
// 1x), logs each variant's median calls a second over its rounds and
// their ratios, and reports them as metrics. It asserts nothing: the
// numbers are for docs/benchmarks.md.
func BenchmarkSmoothInterleaved(b *testing.B) { benchSmooth(b, true) }

const (
	smoothCell   = 2 * time.Second
	smoothRounds = 6
)

func benchSmooth(b *testing.B, interleaved bool) {
	ctx := context.Background()
	schema := func(version int64) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(testbackend.FreshSchemaURL(b))
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 16
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		p := migrator(b, pool)
		if version > 0 {
			_, err = p.UpTo(ctx, version)
		} else {
			_, err = p.Up(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		return pool
	}
	v010, head := schema(1), schema(0)
	if _, err := head.Exec(ctx, `CREATE TABLE baseline (key text PRIMARY KEY, count bigint NOT NULL,
		window_begin timestamptz NOT NULL, window_end timestamptz NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	const upsert = `INSERT INTO baseline AS c (key, count, window_begin, window_end) VALUES ($1, 1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET
			count        = CASE WHEN c.window_end <= $4 THEN 1 ELSE c.count + 1 END,
			window_begin = CASE WHEN c.window_end <= $4 THEN excluded.window_begin ELSE c.window_begin END,
			window_end   = CASE WHEN c.window_end <= $4 THEN excluded.window_end ELSE c.window_end END
		WHERE c.count < $5 OR c.window_end <= $4
		RETURNING count`
	// Never full: every call counts. The smooth rule drains one event a
	// microsecond with a burst of 10^9, so each call moves its TAT by 1µs.
	fixed := countlimit.Rule{UseType: "bench", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Minute)}
	smooth := countlimit.Rule{UseType: "bench", Limit: 1_000_000, Window: countlimit.Smooth(time.Second, 1_000_000_000)}
	upsertCall := func(ctx context.Context, id string) error {
		now := time.Now()
		begin := now.Truncate(time.Minute)
		var n int64
		return head.QueryRow(ctx, upsert, id, begin, begin.Add(time.Minute), now, fixed.Limit).Scan(&n)
	}
	allow := func(pool *pgxpool.Pool, rule countlimit.Rule) func(context.Context, string) error {
		l := countlimit.New(pgstore.New(pool))
		return func(ctx context.Context, id string) error {
			_, err := l.Allow(ctx, rule, id)
			return err
		}
	}
	variants := []benchVariant{
		{"upsert", upsertCall},
		{"fixed@v0.1.0", allow(v010, fixed)},
		{"fixed@head", allow(head, fixed)},
		// Its own use type: a row per id of each kind.
		{"smooth@head", allow(head, countlimit.Rule{UseType: "bench.smooth", Limit: smooth.Limit, Window: smooth.Window})},
	}
	for _, v := range variants {
		for i := range 256 {
			if err := v.call(ctx, fmt.Sprint("user-", i)); err != nil {
				b.Fatalf("%s: warming up: %v", v.name, err)
			}
		}
	}
	for _, pool := range []*pgxpool.Pool{v010, head} {
		if _, err := pool.Exec(ctx, `ANALYZE`); err != nil {
			b.Fatal(err)
		}
	}
	if interleaved {
		runInterleaved(b, variants)
		return
	}
	for _, callers := range []int{1, 16} {
		for _, v := range variants {
			b.Run(fmt.Sprintf("callers=%d/%s", callers, v.name), func(b *testing.B) {
				var next atomic.Int64
				b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
				if callers == 1 {
					for i := 0; b.Loop(); i++ {
						if err := v.call(ctx, fmt.Sprint("user-", i%256)); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := v.call(ctx, fmt.Sprint("user-", next.Add(1)%256)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// benchVariant is one way to count a call of id.
type benchVariant struct {
	name string
	call func(context.Context, string) error
}

// runInterleaved is BenchmarkSmoothInterleaved's run.
func runInterleaved(b *testing.B, variants []benchVariant) {
	callers := []int{1, 16}
	for k, med := range interleave(b, callers, smoothRounds, smoothCell, variants) {
		// variants: upsert, fixed@v0.1.0, fixed@head, smooth@head.
		b.Logf("callers %2d  fixed@head / fixed@v0.1.0 %.2f; smooth@head / upsert %.2f; smooth@head / fixed@head %.2f; fixed@head / upsert %.2f",
			callers[k], med[2]/med[1], med[3]/med[0], med[3]/med[2], med[2]/med[0])
	}
}

// interleave measures variants in one run, alternated so that the
// machine's load falls on each alike: at each number of callers, rounds
// of cell each, in the order of variants, then backwards, and so on (ABC
// CBA ...), each caller calling on ids user-0 to user-255 in turn. It logs
// each variant's median calls a second over its rounds, reports them as
// metrics, and returns them, for each number of callers in order.
func interleave(b *testing.B, callers []int, rounds int, cell time.Duration, variants []benchVariant) [][]float64 {
	ctx := context.Background()
	var meds [][]float64
	for _, callers := range callers {
		rates := make([][]float64, len(variants))
		for round := range rounds {
			for j := range variants {
				i := j
				if round%2 == 1 {
					i = len(variants) - 1 - j
				}
				var calls, next atomic.Int64
				stop := time.Now().Add(cell)
				start := time.Now()
				var wg sync.WaitGroup
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(stop) {
							if err := variants[i].call(ctx, fmt.Sprint("user-", next.Add(1)%256)); err != nil {
								b.Error(err)
								return
							}
							calls.Add(1)
						}
					}()
				}
				wg.Wait()
				rates[i] = append(rates[i], float64(calls.Load())/time.Since(start).Seconds())
			}
		}
		med := make([]float64, len(variants))
		for i := range variants {
			slices.Sort(rates[i])
			med[i] = rates[i][len(rates[i])/2]
			b.Logf("callers %2d  %-22s median %7.0f calls/s  rounds, sorted %v", callers, variants[i].name, med[i], roundRates(rates[i]))
			b.ReportMetric(med[i], fmt.Sprintf("calls/s-%d-%s", callers, variants[i].name))
		}
		meds = append(meds, med)
	}
	return meds
}

func roundRates(rs []float64) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = int(r)
	}
	return out
}
