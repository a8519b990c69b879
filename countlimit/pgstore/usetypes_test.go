package pgstore_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// useTypesPerID are the statements that lock, read or write one or two
// rules of an id, each on its hot path, given the id as $1: what any of
// them reads must not grow with the id's other rows (DESIGN: caller-chosen
// use types cost O(1) a call).
var useTypesPerID = []struct{ name, sql string }{
	// AllowAll, and sliding and smooth rules; refunds and peeks alike.
	{"countlimit_apply/allow", applySQL("allow")},
	{"countlimit_apply/refund", applySQL("refund")},
	{"countlimit_apply/peek", applySQL("peek")},
	// The same calls on the pool's group commit.
	{"countlimit_apply_batch/allow", applyBatchSQL("allow")},
	{"countlimit_apply_batch/refund", applyBatchSQL("refund")},
	// Reset.
	{"countlimit_reset", `SELECT countlimit_reset($1, ARRAY['ut-absent-1', 'ut-absent-2'])`},
	// The fixed window on the pool: a lone call, and a group commit's
	// batch of distinct keys and of one key's calls; then the statements
	// those fall back to, for keys that are new or held.
	{"countlimit_allow_one_pooled", `SELECT * FROM countlimit_allow_one_pooled('ut-1', $1, now(), 1, 1e15::bigint,
		date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', NULL, 'fixed')`},
	{"countlimit_allow_distinct_pooled", distinctSQL("countlimit_allow_distinct_pooled")},
	{"countlimit_allow_distinct", distinctSQL("countlimit_allow_distinct")},
	{"countlimit_allow_batch_pooled", batchSQL("countlimit_allow_batch_pooled")},
	{"countlimit_allow_batch", batchSQL("countlimit_allow_batch")},
}

func applySQL(op string) string {
	return `SELECT * FROM countlimit_apply('` + op + `', $1, now(), 1, ARRAY['ut-1', 'ut-2'],
		ARRAY[1e15, 1e15]::bigint[], ARRAY[now(), now()], ARRAY[3600000000, 3600000000]::bigint[],
		ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[], ARRAY['fixed', 'fixed'], ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[])`
}

func applyBatchSQL(op string) string {
	return `SELECT * FROM countlimit_apply_batch(ARRAY['` + op + `'], ARRAY[$1], ARRAY[now()], ARRAY[1]::bigint[],
		ARRAY[1, 3], ARRAY['ut-1', 'ut-2'],
		ARRAY[1e15, 1e15]::bigint[], ARRAY[now(), now()], ARRAY[3600000000, 3600000000]::bigint[],
		ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[], ARRAY['fixed', 'fixed'], ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[])`
}

func distinctSQL(fn string) string {
	return `SELECT * FROM ` + fn + `(ARRAY['ut-1', 'ut-2'], ARRAY[$1, $1],
		ARRAY[now(), now()], ARRAY[1, 1]::bigint[], ARRAY[1e15, 1e15]::bigint[],
		ARRAY[date_trunc('hour', now()), date_trunc('hour', now())],
		ARRAY[date_trunc('hour', now()) + interval '1 hour', date_trunc('hour', now()) + interval '1 hour'],
		ARRAY[NULL, NULL]::timestamptz[], ARRAY['fixed', 'fixed'])`
}

func batchSQL(fn string) string {
	return `SELECT * FROM ` + fn + `(ARRAY['ut-1'], ARRAY[$1], ARRAY[1, 1], ARRAY[1, 2],
		ARRAY[now(), now()], ARRAY[1, 1]::bigint[], ARRAY[1e15, 1e15]::bigint[],
		ARRAY[date_trunc('hour', now()), date_trunc('hour', now())],
		ARRAY[date_trunc('hour', now()) + interval '1 hour', date_trunc('hour', now()) + interval '1 hour'],
		ARRAY[NULL, NULL]::timestamptz[], ARRAY['fixed', 'fixed'])`
}

// useTypesPerIDSchema returns a one-connection pool on a fresh schema
// where id-10 has 10 use types and id-20000 has 20 000 (fixed windows of
// an hour with room), beside 40 000 ids of one row each, analyzed as a
// table of many ids is. Each of setup's statements runs on the connection.
func useTypesPerIDSchema(t testing.TB, setup ...string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool := dbaSchema(t, 1, nil, setup...)
	if _, err := pool.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value, already_count, window_kind)
		SELECT 'ut-' || g, 'id-' || n, date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', 1e15, 1, 'fixed'
		FROM unnest(ARRAY[10, 20000]) n, generate_series(0, n - 1) g
		UNION ALL
		SELECT 'ut-0', 'one-' || g, date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour', 1e15, 1, 'fixed'
		FROM generate_series(1, 40000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE count_limit"); err != nil {
		t.Fatal(err)
	}
	return pool
}

var buffersLine = regexp.MustCompile(`^\s*Buffers: shared hit=(\d+)(?: read=(\d+))?`)

// statementBuffers runs sql for id under EXPLAIN (ANALYZE, BUFFERS) and
// returns the buffers its top node read: the whole statement's, the
// functions it calls included.
func statementBuffers(t testing.TB, pool *pgxpool.Pool, sql, id string) int {
	t.Helper()
	rows, err := pool.Query(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+sql, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	hits := -1
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		if m := buffersLine.FindStringSubmatch(line); m != nil && hits < 0 {
			hit, _ := strconv.Atoi(m[1])
			read, _ := strconv.Atoi(m[2] + "0")
			hits = hit + read/10
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if hits < 0 {
		t.Fatalf("EXPLAIN of %s printed no buffers", sql)
	}
	return hits
}

// TestUseTypesPerIDCostNothing holds every statement of useTypesPerID to
// the buffers of an id with 10 use types when its id has 20 000, with the
// plans PostgreSQL caches for a session (generic ones: a statement's
// plan after its first five calls, whatever the id): a plan that takes
// the id alone as its index condition and filters the use types reads
// every row of the id.
func TestUseTypesPerIDCostNothing(t *testing.T) {
	pool := useTypesPerIDSchema(t, "SET plan_cache_mode = force_generic_plan")
	for _, st := range useTypesPerID {
		t.Run(st.name, func(t *testing.T) {
			statementBuffers(t, pool, st.sql, "id-10") // the catalog read once
			few := statementBuffers(t, pool, st.sql, "id-10")
			many := statementBuffers(t, pool, st.sql, "id-20000")
			// A B-tree descent more, and a row version more, at the most.
			if many > 2*few+8 {
				t.Errorf("%s read %d buffers on an id with 20 000 use types, %d on one with 10", st.name, many, few)
			}
		})
	}
}

// BenchmarkUseTypesPerID reports the buffers each statement of
// useTypesPerID reads on an id that 10 or 20 000 use types count, with the
// plans a pool's connection caches after the first few calls (PostgreSQL
// chooses); docs/benchmarks.md has the figures.
func BenchmarkUseTypesPerID(b *testing.B) {
	pool := useTypesPerIDSchema(b)
	for _, st := range useTypesPerID {
		for _, id := range []string{"id-10", "id-20000"} {
			b.Run(fmt.Sprintf("%s/use-types=%s", st.name, id[3:]), func(b *testing.B) {
				hits := 0 // the last call's: its plan is cached after the first few
				for b.Loop() {
					hits = statementBuffers(b, pool, st.sql, id)
				}
				b.ReportMetric(float64(hits), "buffers/op")
			})
		}
	}
}
