package pgstore_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// BenchmarkUseTypesPerID reports the buffers PostgreSQL reads for one
// statement on one or two rules of an id that 10 or 20 000 use types
// count, beside 40 000 ids of one row each (analyzed, as a table of many
// ids is): countlimit_apply's allow (AllowAll, sliding and smooth rules;
// refunds lock their rows alike), countlimit_reset (Reset), and the fixed
// window's statements on the pool: a lone call (allow_one_pooled) and a
// group commit's batch of distinct keys and of one key's calls. Each runs
// as EXPLAIN (ANALYZE, BUFFERS) on one connection, whose plans are cached
// as a pool's are after the first few calls. A call's work should not
// grow with the id's other rows; docs/benchmarks.md has the figures.
func BenchmarkUseTypesPerID(b *testing.B) {
	ctx := context.Background()
	pool := dbaSchema(b, 1, nil)
	l := countlimit.New(pgstore.New(pool))
	for _, n := range []int{10, 20000} {
		for i := 0; i < n; i += expose.MaxRules {
			var rules []countlimit.Rule
			for j := i; j < min(n, i+expose.MaxRules); j++ {
				rules = append(rules, countlimit.Rule{UseType: countlimit.UseType(fmt.Sprint("ut-", j)), Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)})
			}
			if _, err := l.AllowAll(ctx, fmt.Sprint("id-", n), rules...); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO count_limit
		SELECT (jsonb_populate_record(c, jsonb_build_object('unique_id', 'one-' || g))).*
		FROM count_limit c, generate_series(1, 40000) g WHERE c.unique_id = 'id-10' AND c.use_type = 'ut-0'`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE count_limit"); err != nil {
		b.Fatal(err)
	}
	buffers := regexp.MustCompile(`^\s*Buffers: shared hit=(\d+)`)
	for _, op := range []struct{ name, sql string }{
		{"countlimit_apply", `SELECT * FROM countlimit_apply('allow', $1, now(), 1, ARRAY['ut-1', 'ut-2'],
			ARRAY[1e15, 1e15]::bigint[], ARRAY[now(), now()], ARRAY[3600000000, 3600000000]::bigint[],
			ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[], ARRAY['fixed', 'fixed'], ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[])`},
		{"countlimit_reset", `SELECT countlimit_reset($1, ARRAY['ut-absent-1', 'ut-absent-2'])`},
		{"countlimit_allow_one_pooled", `SELECT * FROM countlimit_allow_one_pooled('ut-1', $1, now(), 1, 1e15::bigint,
			date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', NULL, 'fixed')`},
		{"countlimit_allow_distinct_pooled", `SELECT * FROM countlimit_allow_distinct_pooled(ARRAY['ut-1', 'ut-2'], ARRAY[$1, $1],
			ARRAY[now(), now()], ARRAY[1, 1]::bigint[], ARRAY[1e15, 1e15]::bigint[],
			ARRAY[date_trunc('hour', now()), date_trunc('hour', now())],
			ARRAY[date_trunc('hour', now()) + interval '1 hour', date_trunc('hour', now()) + interval '1 hour'],
			ARRAY[NULL, NULL]::timestamptz[], ARRAY['fixed', 'fixed'])`},
		{"countlimit_allow_batch_pooled", `SELECT * FROM countlimit_allow_batch_pooled(ARRAY['ut-1'], ARRAY[$1], ARRAY[1, 1], ARRAY[1, 2],
			ARRAY[now(), now()], ARRAY[1, 1]::bigint[], ARRAY[1e15, 1e15]::bigint[],
			ARRAY[date_trunc('hour', now()), date_trunc('hour', now())],
			ARRAY[date_trunc('hour', now()) + interval '1 hour', date_trunc('hour', now()) + interval '1 hour'],
			ARRAY[NULL, NULL]::timestamptz[], ARRAY['fixed', 'fixed'])`},
	} {
		for _, n := range []int{10, 20000} {
			b.Run(fmt.Sprintf("%s/use-types=%d", op.name, n), func(b *testing.B) {
				hits := 0 // the last call's: its plan is cached after the first few
				for b.Loop() {
					hits = 0
					rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+op.sql, fmt.Sprint("id-", n))
					if err != nil {
						b.Fatal(err)
					}
					for rows.Next() {
						var line string
						if err := rows.Scan(&line); err != nil {
							b.Fatal(err)
						}
						if m := buffers.FindStringSubmatch(line); m != nil && hits == 0 {
							hits, _ = strconv.Atoi(m[1]) // the top node's: the whole statement
						}
					}
					if err := rows.Err(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(hits), "buffers/op")
			})
		}
	}
}
