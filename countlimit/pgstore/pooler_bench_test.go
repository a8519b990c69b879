//go:build unix

package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgbouncer"
)

// BenchmarkPooler measures Allow three ways, in one run, alternated
// (interleave: rounds of poolerCell, ABC CBA ...), at 1, 16 and 64
// callers over 256 ids whose rows exist (counted once and analyzed
// first), each on a pool of pgx's defaults of its own, on one schema:
//
//   - direct: the Store on a direct connection, where it finds its
//     connections reach PostgreSQL itself and prepares its statements, as
//     the Store before it worked behind a pooler did;
//   - unprepared: the Store on a direct connection, made to send its
//     statements as it does behind a pooler (pgstore.UnpreparedForTest):
//     what one mode for both would cost there;
//   - pgbouncer: the Store through pgbouncer in transaction pooling
//     (default_pool_size 20, pgbouncer's own default), unprepared.
//
// It does so for a fixed window (group commit) and a sliding one (a
// statement after countlimit_lock_briefly, one commit per call). It runs
// once whatever b.N (run it with -benchtime 1x), logs each variant's
// median calls a second over its rounds and the ratios unprepared /
// direct and pgbouncer / direct, and reports the medians as metrics. It
// asserts nothing: the numbers are for docs/benchmarks.md.
func BenchmarkPooler(b *testing.B) {
	ctx := context.Background()
	url := testbackend.FreshSchemaURL(b)
	bouncer := pgbouncer.Start(b, url, "default_pool_size = 20")
	open := func(url string) *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		return pool
	}
	admin := open(url)
	if err := pgstore.Migrate(ctx, admin); err != nil {
		b.Fatal(err)
	}
	stores := []struct {
		name  string
		store *pgstore.Store
	}{
		{"direct", pgstore.New(open(url))},
		{"unprepared", pgstore.UnpreparedForTest(open(url))},
		{"pgbouncer", pgstore.New(open(bouncer.URL()))},
	}
	for _, w := range []countlimit.Window{countlimit.Fixed(time.Hour), countlimit.Sliding(time.Second)} {
		var variants []benchVariant
		for _, s := range stores {
			// Rows of its own: a sliding log's length is the calls of
			// its last second.
			rule := countlimit.Rule{UseType: storetest.UseType(b, "pooler."+s.name), Limit: expose.MaxSlidingLimit, Window: w}
			l := countlimit.New(s.store)
			variants = append(variants, benchVariant{s.name, func(ctx context.Context, id string) error {
				_, err := l.Allow(ctx, rule, id)
				return err
			}})
		}
		for _, v := range variants {
			for i := range 256 {
				if err := v.call(ctx, fmt.Sprint("user-", i)); err != nil {
					b.Fatalf("%s: warming up: %v", v.name, err)
				}
			}
		}
		if _, err := admin.Exec(ctx, `ANALYZE count_limit`); err != nil {
			b.Fatal(err)
		}
		callers := []int{1, 16, 64}
		b.Logf("%s window", w)
		for k, med := range interleave(b, callers, poolerRounds, poolerCell, variants) {
			b.Logf("%s window, callers %2d: unprepared / direct %.2f; pgbouncer / direct %.2f", w, callers[k], med[1]/med[0], med[2]/med[0])
		}
	}
}

const (
	poolerCell   = 2 * time.Second
	poolerRounds = 6
)

// BenchmarkPoolerServerCPU measures what the server spends on an Allow of
// one caller, the CPU time of the server process behind a pool of one
// connection (/proc/PID/stat: the server must run on this machine), for
// direct and unprepared as BenchmarkPooler has them, in one run,
// alternated: rounds of poolerCPUCalls calls over 256 ids, AB BA ..., for
// a fixed window and a sliding one. It logs each variant's median over the
// rounds and their ratio, and reports the medians as metrics; run it with
// -benchtime 1x. A machine that runs other work beside it charges the
// server's process for the caches and cycles it loses: the ratio is the
// figure, more than the times.
func BenchmarkPoolerServerCPU(b *testing.B) {
	ctx := context.Background()
	url := testbackend.FreshSchemaURL(b)
	open := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(pool.Close)
		return pool
	}
	direct, unprepared := open(), open()
	if err := pgstore.Migrate(ctx, direct); err != nil {
		b.Fatal(err)
	}
	variants := []struct {
		name  string
		pool  *pgxpool.Pool
		store *pgstore.Store
	}{
		{"direct", direct, pgstore.New(direct)},
		{"unprepared", unprepared, pgstore.UnpreparedForTest(unprepared)},
	}
	serverCPU := func(pool *pgxpool.Pool) time.Duration {
		var pid int32
		if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
			b.Fatal(err)
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Skipf("the server's process is not on this machine: %v", err)
		}
		// utime and stime, in clock ticks (USER_HZ, 100 a second), are
		// fields 14 and 15; the command name before them may hold spaces.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(u+s) * 10 * time.Millisecond
	}
	for _, w := range []countlimit.Window{countlimit.Fixed(time.Hour), countlimit.Sliding(time.Second)} {
		per := make([][]time.Duration, len(variants))
		for round := range poolerRounds {
			for j := range variants {
				i := j
				if round%2 == 1 {
					i = len(variants) - 1 - j
				}
				v := variants[i]
				l := countlimit.New(v.store)
				rule := countlimit.Rule{UseType: storetest.UseType(b, "cpu."+v.name), Limit: expose.MaxSlidingLimit, Window: w}
				for k := range 256 {
					if _, err := l.Allow(ctx, rule, fmt.Sprint("user-", k)); err != nil {
						b.Fatal(err)
					}
				}
				before := serverCPU(v.pool)
				for k := range poolerCPUCalls {
					if _, err := l.Allow(ctx, rule, fmt.Sprint("user-", k%256)); err != nil {
						b.Fatal(err)
					}
				}
				per[i] = append(per[i], (serverCPU(v.pool)-before)/poolerCPUCalls)
			}
		}
		med := make([]time.Duration, len(variants))
		for i, v := range variants {
			slices.Sort(per[i])
			med[i] = per[i][len(per[i])/2]
			b.Logf("%s window  %-10s server CPU per call, median %v  rounds, sorted %v", w, v.name, med[i], per[i])
			b.ReportMetric(float64(med[i].Microseconds()), fmt.Sprintf("server-us/call-%s-%s", w.String()[:5], v.name))
		}
		b.Logf("%s window: unprepared / direct %.2f", w, float64(med[1])/float64(med[0]))
	}
}

const poolerCPUCalls = 3000
