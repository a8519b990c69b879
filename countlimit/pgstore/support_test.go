package pgstore_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestSupportQueriesUseIndexes checks, on 200 000 rows, that the queries a
// DBA runs most (every limit of one id; who is blocked now) read an index,
// not the whole table.
func TestSupportQueriesUseIndexes(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a table with 200 000 rows")
	}
	pool := testbackend.FreshSchema(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// 2 000 use types × 100 ids; one row in 1 000 blocked now, one in
	// 1 000 blocked in the past.
	if _, err := pool.Exec(ctx, `
		INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, blocked_until)
		SELECT 'ut.' || (i / 100), 'user-' || (i % 100) || '-' || (i / 20000), 1, now(), now() + interval '1 hour', 10,
			CASE WHEN i % 1000 = 0 THEN now() + interval '1 hour' WHEN i % 1000 = 1 THEN now() - interval '1 hour' END
		FROM generate_series(0, 199999) AS i`); err != nil {
		t.Fatal(err)
	}
	// Two live leases on one row in ten: the view counts them per row.
	if _, err := pool.Exec(ctx, `
		INSERT INTO count_limit_lease (use_type, unique_id, lease_token, expires_at, taken_at)
		SELECT use_type, unique_id, 'tok-' || n, now() + interval '10 minutes', now()
		FROM count_limit, generate_series(1, 2) AS n
		WHERE hashtext(unique_id || use_type) % 10 = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE count_limit, count_limit_lease"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct{ name, sql string }{
		{"one id's limits", "SELECT * FROM count_limit_status WHERE unique_id = 'user-7-3'"},
		{"blocked now (view)", "SELECT * FROM count_limit_status WHERE blocked ORDER BY blocked_until DESC LIMIT 100"},
		{"blocked now (table)", "SELECT use_type, unique_id, blocked_until FROM count_limit WHERE blocked_until > now()"},
	} {
		var raw []byte
		if err := pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q.sql).Scan(&raw); err != nil {
			t.Fatalf("%s: %v", q.name, err)
		}
		var plan []struct{ Plan planNode }
		if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("%s: EXPLAIN gave %s: %v", q.name, raw, err)
		}
		var seq []string
		var index bool
		plan[0].Plan.walk(func(n *planNode) {
			switch n.Type {
			case "Seq Scan":
				seq = append(seq, n.Relation)
			case "Index Scan", "Index Only Scan", "Bitmap Heap Scan":
				index = index || n.Relation == "count_limit"
			}
		})
		if len(seq) > 0 || !index {
			t.Errorf("%s: the plan scans %v without an index (want an index scan of count_limit, no Seq Scan):\n%s", q.name, seq, raw)
		}
	}
}
