package pgstore_test

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// operationsDoc is the operator's guide, whose recipes these tests run.
const operationsDoc = "../../docs/operations.md"

// pgCronRecipe returns the SQL block after <!-- pg_cron-recipe --> in the
// operator's guide, and the command it schedules (between $job$ and $job$).
func pgCronRecipe(t *testing.T) (block, job string) {
	t.Helper()
	raw, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "<!-- pg_cron-recipe -->\n```sql\n")
	if !ok {
		t.Fatalf("%s: no <!-- pg_cron-recipe --> SQL block", operationsDoc)
	}
	block, _, _ = strings.Cut(after, "```")
	m := regexp.MustCompile(`(?s)^SELECT cron\.schedule_in_database\(\s*'countlimit-purge',\s*'[^']+',\s*\$job\$\n(.*)\$job\$,`).FindStringSubmatch(block)
	if m == nil {
		t.Fatalf("%s: the pg_cron recipe is not cron.schedule_in_database('countlimit-purge', schedule, $job$...$job$, database):\n%s", operationsDoc, block)
	}
	return block, m[1]
}

// seedRecipe writes 25 000 expired rows (three batches of the recipe's
// 10 000), 3 keys whose 2 leases each have expired, and what must stay: a
// current window, a lifetime count, a penalty and a live lease. It
// returns the rows and leases that must stay.
func seedRecipe(t *testing.T, pool *pgxpool.Pool) (rows, leases []string) {
	t.Helper()
	for _, sql := range []string{`
		INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value)
		SELECT 'old', 'id-' || i, 1, now() - interval '2 hours', now() - interval '1 hour', 1
		FROM generate_series(1, 25000) i`, `
		INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value, lease_until)
		SELECT 'slots', 'gone-' || i, now() - interval '2 hours', now() - interval '2 hours', 2, now() - interval '1 hour'
		FROM generate_series(1, 3) i`, `
		INSERT INTO count_limit_lease (use_type, unique_id, lease_token, expires_at, taken_at)
		SELECT 'slots', 'gone-' || i, 'token-' || i || '-' || j, now() - interval '1 hour', now() - interval '2 hours'
		FROM generate_series(1, 3) i, generate_series(1, 2) j`, `
		INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, blocked_until) VALUES
			('hour', 'live', 1, now(), now() + interval '1 hour', 5, NULL),
			('forever', 'keep', 1, now() - interval '2 hours', NULL, 1, NULL),
			('blocked', 'keep', 1, now() - interval '2 hours', now() - interval '1 hour', 1, now() + interval '1 day')`, `
		INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value, lease_until)
		VALUES ('slots', 'held', now(), now(), 2, now() + interval '1 hour')`, `
		INSERT INTO count_limit_lease (use_type, unique_id, lease_token, expires_at, taken_at)
		VALUES ('slots', 'held', 'token-held', now() + interval '1 hour', now())`,
	} {
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"blocked/keep", "forever/keep", "hour/live", "slots/held"}, []string{"slots/held"}
}

// TestPgCronRecipeJob runs the command the guide's pg_cron recipe
// schedules, as pg_cron runs it (one simple-protocol statement, outside
// any transaction block, on the job user's search_path), on expired and
// live rows and leases: one run deletes everything expired, batch after
// committed batch, and nothing live. Running the scheduling itself needs
// pg_cron: see TestPgCronRecipeScheduled.
func TestPgCronRecipeJob(t *testing.T) {
	t.Parallel()
	_, job := pgCronRecipe(t)
	pool := testbackend.FreshSchema(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	wantRows, wantLeases := seedRecipe(t, pool)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, job, pgx.QueryExecModeSimpleProtocol)
	conn.Release()
	if err != nil {
		t.Fatalf("the recipe's job:\n%s\nfailed: %v", job, err)
	}
	rows, leases := testbackend.PurgeLeft(t, pool)
	if !slices.Equal(rows, wantRows) || !slices.Equal(leases, wantLeases) {
		t.Errorf("after one run of the recipe's job: %d rows (the first %v), leases %v; want rows %v and leases %v",
			len(rows), rows[:min(len(rows), 8)], leases, wantRows, wantLeases)
	}
}

// TestOperationsGoSnippet: the guide's Go block is ExampleStore_PurgeEvery's
// code, which the compiler checks, line for line.
func TestOperationsGoSnippet(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(raw), -1)
	if len(blocks) != 1 {
		t.Fatalf("%s holds %d Go blocks, want the one of PurgeEvery", operationsDoc, len(blocks))
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	trim := func(s string) []string {
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			out = append(out, strings.TrimSpace(line))
		}
		return out
	}
	doc, code := trim(blocks[0][1]), trim(string(example))
	for i := range code {
		if i+len(doc) <= len(code) && slices.Equal(code[i:i+len(doc)], doc) {
			return
		}
	}
	t.Errorf("%s's Go block is not in example_test.go, line for line:\n%s", operationsDoc, blocks[0][1])
}
