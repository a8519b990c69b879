package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/store/pgmigrate"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// ExampleNew needs PostgreSQL: where there is none (and none is required)
// the examples are left out, as the tests skip.
func TestMain(m *testing.M) { testenv.MainNeeding(m, "PostgreSQL", testenv.FindPostgres) }

func TestConformance(t *testing.T) {
	pools := []*pgxpool.Pool{testbackend.Postgres(t), testbackend.PostgresPool(t)}
	// Two pools, per subtest: two clients on the same counters.
	next := testbackend.Alternate(pools...)
	storetest.Run(t, func(t *testing.T) driver.Store { return pgstore.New(next(t)) })
}

// counter is a pgx QueryTracer and BatchTracer that counts round trips
// (a statement, or a pipeline of them) and keeps the last statement's SQL.
// On a pool, a call that is not a group commit's is a pipeline of
// countlimit_lock_briefly and its statement: one round trip.
type counter struct {
	n    atomic.Int64
	last atomic.Value // string
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.last.Store(d.SQL)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *counter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.last.Store(d.SQL)
}
func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tracedPool returns a pool of cfg whose statements tracer counts,
// closed when the test ends.
func tracedPool(t *testing.T, cfg *pgxpool.Config) (*pgxpool.Pool, *counter) {
	t.Helper()
	tracer := &counter{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, tracer
}

func TestOneStatementPerCall(t *testing.T) {
	pool, tracer := tracedPool(t, testbackend.PoolConfig(t))
	ctx := context.Background()
	if err := pool.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("pool", func(t *testing.T) { oneStatementPerCall(t, tracer, pgstore.New(pool), true) })
	// In the caller's transaction every call is its own statement, at once,
	// and never a group commit.
	t.Run("tx", func(t *testing.T) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		oneStatementPerCall(t, tracer, pgstore.New(tx), false)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// oneStatementPerCall checks that each call is one statement (one round
// trip; see counter), once s has looked at where its connections go (its
// first statement, or the process's on that address, may bring one more:
// a Ping first). On a pool
// (pooled), a lone Allow is AllowBatchDistinct of one call, which never
// waits for a row another transaction holds; in a transaction it is
// AllowOne, and nothing is sent as a group commit.
func oneStatementPerCall(t *testing.T, tracer *counter, s *pgstore.Store, pooled bool) {
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	l := countlimit.New(s)
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "one"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "one.sliding"), Limit: 5, Window: countlimit.Sliding(time.Minute), Block: time.Minute}
	calls := []struct {
		name string
		call func() error
	}{
		{"Allow (new row)", func() error { _, err := l.Allow(ctx, fixed, "new"); return err }},
		{"Allow (existing row)", func() error { _, err := l.Allow(ctx, fixed, "new"); return err }},
		{"AllowN", func() error { _, err := l.AllowN(ctx, fixed, "new", 2); return err }},
		{"AllowN denied", func() error { _, err := l.AllowN(ctx, fixed, "new", 9); return err }},
		{"Allow sliding", func() error { _, err := l.Allow(ctx, sliding, "new"); return err }},
		{"Peek", func() error { _, err := l.Peek(ctx, fixed, "new"); return err }},
		{"Peek (no row)", func() error { _, err := l.Peek(ctx, fixed, "nobody"); return err }},
		{"Refund", func() error { _, err := l.Refund(ctx, fixed, "new", 1); return err }},
		{"AllowAll (3 rules)", func() error {
			third := fixed
			third.UseType += ".3"
			_, err := l.AllowAll(ctx, "new", fixed, sliding, third)
			return err
		}},
		{"CheckLimit", func() error { _, err := l.CheckLimit(ctx, fixed.UseType, "cl", 3, time.Hour, time.Time{}); return err }},
		{"Reset", func() error { return l.Reset(ctx, fixed, "new") }},
	}
	for _, c := range calls {
		before := tracer.n.Load()
		if err := c.call(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := tracer.n.Load() - before; got != 1 {
			t.Errorf("%s sent %d statements, want exactly 1", c.name, got)
		}
		if sql, _ := tracer.last.Load().(string); !pooled && strings.Contains(sql, "AllowBatch") {
			t.Errorf("%s was sent as a group commit", c.name)
		}
	}
}

func TestTransactionCommitsOrRollsBackWithCaller(t *testing.T) {
	commitsOrRollsBackWithCaller(t, testbackend.Postgres(t))
}

// commitsOrRollsBackWithCaller pins an article at most once a month, the
// check and the pin in one transaction on pool. The test's own statements
// prepare nothing, so that they run behind a transaction pooler too.
func commitsOrRollsBackWithCaller(t *testing.T, pool *pgxpool.Pool) {
	ctx := context.Background()
	rule := countlimit.Rule{UseType: storetest.UseType(t, "tx"), Limit: 1, Window: countlimit.Calendar(countlimit.Month, time.UTC)}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgstore_test_pins (user_id text, article int)`); err != nil {
		t.Fatal(err)
	}
	pin := func(commit bool) countlimit.Result {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		res, err := countlimit.New(pgstore.New(tx)).Allow(ctx, rule, "author-1")
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			if _, err := tx.Exec(ctx, `INSERT INTO pgstore_test_pins VALUES ($1, 7)`, pgx.QueryExecModeExec, string(rule.UseType)); err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return res
	}
	pins := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgstore_test_pins WHERE user_id = $1`, pgx.QueryExecModeExec, string(rule.UseType)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if r := pin(false); !r.Allowed {
		t.Fatalf("first pin, rolled back: %+v, want allowed", r)
	}
	if r := pin(true); !r.Allowed {
		t.Fatalf("pin after a rolled-back pin: %+v, want allowed (the rollback took the count back)", r)
	}
	if r := pin(true); r.Allowed {
		t.Fatalf("second committed pin in the month: %+v, want denied", r)
	}
	if n := pins(); n != 1 {
		t.Errorf("%d pins written, want 1", n)
	}
}

func TestUnreachable(t *testing.T) {
	silent, refused := testbackend.DeadAddrs(t)
	rule := countlimit.Rule{UseType: "down", Limit: 10, Window: countlimit.Fixed(time.Minute)}
	for _, tc := range []struct{ name, addr string }{{"silent server", silent}, {"connection refused", refused}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(fmt.Sprintf("postgres://u@%s/db?sslmode=disable&connect_timeout=30", tc.addr))
			if err != nil {
				t.Fatal(err)
			}
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg) // connects lazily
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			l := countlimit.New(pgstore.New(pool))
			const deadline = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			res, err := l.Allow(ctx, rule, "id")
			elapsed := time.Since(start)
			if !errors.Is(err, countlimit.ErrUnavailable) {
				t.Fatalf("err = %v, want ErrUnavailable", err)
			}
			if res.Allowed {
				t.Error("Allowed = true on a failing store")
			}
			// Not a speed goal: the call must give up with its context,
			// not after the 30 s connect timeout.
			if elapsed > deadline+5*time.Second {
				t.Errorf("returned after %v, long past the context deadline of %v", elapsed, deadline)
			}
			if _, err := l.AllowAll(ctx, "id", rule); !errors.Is(err, countlimit.ErrUnavailable) {
				t.Errorf("AllowAll: err = %v, want ErrUnavailable", err)
			}
			if err := l.Reset(ctx, rule, "id"); !errors.Is(err, countlimit.ErrUnavailable) {
				t.Errorf("Reset: err = %v, want ErrUnavailable", err)
			}
		})
	}
}

// TestDeniedAllowAllLeavesNoRow: a rule that had room in a multi-rule check
// another rule denied leaves no row behind, as in the other stores.
func TestDeniedAllowAllLeavesNoRow(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	l := countlimit.New(pgstore.New(pool))
	fits := countlimit.Rule{UseType: storetest.UseType(t, "fits"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	denies := countlimit.Rule{UseType: storetest.UseType(t, "denies"), Limit: 0, Window: countlimit.Fixed(time.Hour)}
	res, err := l.AllowAll(ctx, "fresh-id", fits, denies)
	if err != nil || res[0].Allowed {
		t.Fatalf("AllowAll = %+v, %v; want denied", res, err)
	}
	var rows []string
	r, err := pool.Query(ctx, `SELECT use_type FROM count_limit WHERE unique_id = 'fresh-id' AND use_type = ANY($1)`,
		[]string{string(fits.UseType), string(denies.UseType)})
	if err != nil {
		t.Fatal(err)
	}
	if rows, err = pgx.CollectRows(r, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0] != string(denies.UseType) {
		t.Errorf("rows after a denied AllowAll: %v; want only the denying rule's (its denial tally)", rows)
	}
}

func TestMigrateUpDownUp(t *testing.T) {
	pool := testbackend.FreshSchema(t)
	ctx := context.Background()
	if err := pgstore.New(pool).Ping(ctx); !errors.Is(err, countlimit.ErrUnavailable) || !strings.Contains(err.Error(), "schema is missing") {
		t.Errorf("Ping before Migrate = %v, want ErrUnavailable saying the schema is missing", err)
	}
	defer func() {
		if err := pgstore.New(pool).Ping(ctx); err != nil {
			t.Errorf("Ping after up/down/up: %v", err)
		}
	}()
	tables := func() (n int) {
		t.Helper()
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
			WHERE s.nspname = current_schema() AND c.relname IN ('count_limit', 'count_limit_status')`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatalf("second Migrate (nothing pending): %v", err)
	}
	if n := tables(); n != 2 {
		t.Fatalf("after up: %d of count_limit, count_limit_status exist", n)
	}
	var version int64
	if err := pool.QueryRow(ctx, `SELECT max(version_id) FROM `+pgmigrate.VersionTable).Scan(&version); err != nil || version < 1 {
		t.Fatalf("version table %s: version %d, %v", pgmigrate.VersionTable, version, err)
	}
	p := migrator(t, pool)
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	// Nothing of countlimit's is left in the schema: no table, index,
	// view or function, goose's version table aside.
	var left []string
	rows, err := pool.Query(ctx, `SELECT c.relkind::text || ' ' || c.relname FROM pg_class c
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relname NOT LIKE $1 || '%'
		UNION ALL SELECT 'function ' || p.proname FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
		UNION ALL SELECT 'type ' || t.typname FROM pg_type t
		WHERE t.typnamespace = current_schema()::regnamespace AND t.typname NOT LIKE $1 || '%' AND t.typname NOT LIKE '\_%'`,
		pgmigrate.VersionTable)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		left = append(left, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("after down, left in the schema: %v", left)
	}
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatalf("up again: %v", err)
	}
	l := countlimit.New(pgstore.New(pool))
	if r, err := l.Allow(ctx, countlimit.Rule{UseType: "after.migrate", Limit: 1, Window: countlimit.Lifetime()}, "x"); err != nil || !r.Allowed {
		t.Fatalf("Allow after up/down/up: %+v, %v", r, err)
	}
}

func TestConcurrentMigrate(t *testing.T) { concurrentMigrate(t, testbackend.FreshSchema(t)) }

// concurrentMigrate runs four Migrates at once on pool, of a new schema.
func concurrentMigrate(t *testing.T, pool *pgxpool.Pool) {
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pgstore.Migrate(context.Background(), pool)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
}

func TestSchemaIsDocumentedForDBAs(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		SELECT a.attname FROM pg_attribute a
		WHERE a.attrelid = 'count_limit'::regclass AND a.attnum > 0 AND NOT a.attisdropped
		  AND col_description(a.attrelid, a.attnum) IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	undocumented, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(undocumented) > 0 {
		t.Errorf("count_limit columns without COMMENT ON: %v", undocumented)
	}
	var opts []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'count_limit'::regclass`).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(opts) != "[fillfactor=80]" {
		t.Errorf("count_limit reloptions = %v, want fillfactor=80 for HOT updates", opts)
	}

	// The view reads like the API: used, remaining, blocked, for the database's now.
	ut := storetest.UseType(t, "view")
	l := countlimit.New(pgstore.New(pool))
	rule := countlimit.Rule{UseType: ut, Limit: 2, Window: countlimit.Rolling(time.Hour), Block: 10 * time.Minute}
	for range 3 {
		if _, err := l.Allow(ctx, rule, "dba-visible"); err != nil {
			t.Fatal(err)
		}
	}
	var (
		kind                 string
		used, remaining, den int64
		isBlocked            bool
		blockedFor           time.Duration
	)
	err = pool.QueryRow(ctx, `SELECT window_kind, used, remaining, denied_count, blocked, blocked_for
		FROM count_limit_status WHERE use_type = $1 AND unique_id = 'dba-visible'`, string(ut)).
		Scan(&kind, &used, &remaining, &den, &isBlocked, &blockedFor)
	if err != nil {
		t.Fatal(err)
	}
	if kind != "rolling" || used != 2 || remaining != 0 || den != 1 || !isBlocked || blockedFor <= 9*time.Minute {
		t.Errorf("count_limit_status = kind %s used %d remaining %d denied %d blocked %v for %v; want rolling 2 0 1 true ~10m",
			kind, used, remaining, den, isBlocked, blockedFor)
	}
}

func TestPurge(t *testing.T) {
	pool := testbackend.FreshSchema(t)
	purge(t, pool, pool)
}

// purge migrates the new schema of pool, writes rows, and purges them
// through pool; admin, on the same schema, reads what is left.
func purge(t *testing.T, pool, admin *pgxpool.Pool) {
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := pgstore.New(pool)
	l := countlimit.New(store, countlimit.WithClock(clock.Now))
	minute := countlimit.Rule{UseType: "purge.minute", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	blockedRule := countlimit.Rule{UseType: "purge.blocked", Limit: 0, Window: countlimit.Fixed(time.Minute), Block: 24 * time.Hour}
	forever := countlimit.Rule{UseType: "purge.forever", Limit: 1, Window: countlimit.Lifetime()}
	const expired = 250
	for i := range expired {
		if _, err := l.Allow(ctx, minute, fmt.Sprint("id-", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []countlimit.Rule{blockedRule, forever} {
		if _, err := l.Allow(ctx, r, "keep"); err != nil {
			t.Fatal(err)
		}
	}
	clock.Set(clock.Now().Add(time.Hour))
	if _, err := l.Allow(ctx, minute, "live"); err != nil {
		t.Fatal(err)
	}
	// A clock out of range would purge every live window: refused, and
	// nothing deleted (the count below).
	for _, bad := range []time.Time{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC)} {
		if n, err := store.Purge(ctx, bad, 40); !errors.Is(err, countlimit.ErrInvalid) || n != 0 {
			t.Errorf("Purge at %v = %d, %v; want 0, ErrInvalid", bad, n, err)
		}
	}
	n, err := store.Purge(ctx, clock.Now(), 40)
	if err != nil {
		t.Fatal(err)
	}
	if n != expired {
		t.Errorf("Purge deleted %d rows, want %d", n, expired)
	}
	var left []string
	rows, err := admin.Query(ctx, `SELECT use_type || '/' || unique_id FROM count_limit ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	if left, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(left) != "[purge.blocked/keep purge.forever/keep purge.minute/live]" {
		t.Errorf("rows left after purge: %v", left)
	}
	if _, err := store.Purge(ctx, clock.Now(), 0); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Purge with batch size 0: err = %v, want ErrInvalid", err)
	}
}

// TestPurgeSweepsTheWholeTable: a purge sweeps count_limit range by range
// (countlimit_purge_rows), so over a table of many ranges, with more expired
// rows in a range than a batch holds, it deletes every expired row and
// nothing else, through pgstore's Purge and through countlimit_purge
// called in a loop by hand, as a DBA's job does.
func TestPurgeSweepsTheWholeTable(t *testing.T) {
	pool := testbackend.FreshSchema(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// Of 150 000 rows, one in three has ended, but every 7th of those is
	// kept by a penalty and every 11th by a lease's horizon.
	const fill = `
		INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, blocked_until, lease_until)
		SELECT 'sweep', 'id-' || g, 1, now() - interval '2 hours',
			CASE WHEN g % 3 = 0 THEN now() - interval '1 hour' ELSE now() + interval '1 hour' END, 1,
			CASE WHEN g % 21 = 0 THEN now() + interval '1 hour' END,
			CASE WHEN g % 33 = 0 THEN now() + interval '1 hour' END
		FROM generate_series(1, 150000) AS g`
	var want int64
	for g := 1; g <= 150000; g++ {
		if g%3 == 0 && g%21 != 0 && g%33 != 0 {
			want++
		}
	}
	purges := []struct {
		name  string
		purge func() (int64, error)
	}{
		{"Purge", func() (int64, error) { return pgstore.New(pool).Purge(ctx, time.Now(), 700) }},
		{"countlimit_purge in a loop", func() (int64, error) {
			conn, err := pool.Acquire(ctx) // one session: it keeps the sweep's place
			if err != nil {
				return 0, err
			}
			defer conn.Release()
			var total int64
			for {
				var n int64
				if err := conn.QueryRow(ctx, `SELECT countlimit_purge(now(), 700)`).Scan(&n); err != nil {
					return total, err
				}
				if total += n; n < 700 {
					return total, nil
				}
			}
		}},
	}
	for _, p := range purges {
		if _, err := pool.Exec(ctx, `DELETE FROM count_limit`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fill); err != nil {
			t.Fatal(err)
		}
		var pages int64
		if err := pool.QueryRow(ctx, `SELECT pg_relation_size('count_limit') / current_setting('block_size')::bigint`).Scan(&pages); err != nil {
			t.Fatal(err)
		}
		if pages < 2*1024 {
			t.Fatalf("count_limit has %d pages, want at least two ranges of 1024", pages)
		}
		n, err := p.purge()
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
		if n != want {
			t.Errorf("%s deleted %d rows, want %d", p.name, n, want)
		}
		var expired, live int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE end_time <= now() AND blocked_until IS NULL AND lease_until IS NULL),
			count(*) FILTER (WHERE end_time > now()) FROM count_limit`).Scan(&expired, &live); err != nil {
			t.Fatal(err)
		}
		if expired != 0 || live != 100000 {
			t.Errorf("%s left %d expired rows and %d live ones, want 0 and 100000", p.name, expired, live)
		}
	}
}

// BenchmarkAllow measures Allow on PostgreSQL at 16 concurrent callers over
// 256 ids: group commit for a fixed window, one statement per call for a
// sliding one.
func BenchmarkAllow(b *testing.B) {
	pool := testbackend.Postgres(b)
	l := countlimit.New(pgstore.New(pool))
	ctx := context.Background()
	for _, w := range []countlimit.Window{countlimit.Fixed(time.Hour), countlimit.Sliding(time.Second)} {
		// The limit is never reached: every call counts (a sliding log keeps
		// at most MaxSlidingLimit events, so its one-second window must too).
		rule := countlimit.Rule{UseType: storetest.UseType(b, "bench"), Limit: expose.MaxSlidingLimit, Window: w}
		// Every row exists and the table has statistics before the clock
		// starts, as in a service that has run a while: the tests' schema
		// is new, and a plan PostgreSQL caches for a never-analyzed table
		// can be slower until autovacuum analyzes it.
		for i := range 256 {
			if _, err := l.Allow(ctx, rule, fmt.Sprint("user-", i)); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, `ANALYZE count_limit`); err != nil {
			b.Fatal(err)
		}
		b.Run(w.String(), func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Allow(ctx, rule, fmt.Sprint("user-", next.Add(1)%256)); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestPurgeBesideLiveTraffic deletes many expired rows in batches while
// checks run, some on the very rows being purged, and while a transaction
// holds one expired row locked: purge skips what is locked instead of
// waiting, and every check succeeds with a correct count.
func TestPurgeBesideLiveTraffic(t *testing.T) {
	pool := testbackend.FreshSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const expired = 50000
	if _, err := pool.Exec(ctx, `
		INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value)
		SELECT 'old', 'id-' || g, 1, now() - interval '2 hours', now() - interval '1 hour', 1
		FROM generate_series(1, $1::int) AS g`, expired); err != nil {
		t.Fatal(err)
	}
	// A live transaction holds one expired row.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM count_limit WHERE use_type = 'old' AND unique_id = 'id-1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	store := pgstore.New(pool)
	l := countlimit.New(store)
	// Rolling, not Fixed: a fixed minute would end at the next minute's
	// turn, which a run can cross, leaving the rows it revived expired.
	old := countlimit.Rule{UseType: "old", Limit: 1, Window: countlimit.Rolling(time.Hour)}
	live := countlimit.Rule{UseType: "live", Limit: 1 << 40, Window: countlimit.Fixed(time.Hour)}
	done := make(chan struct{})
	var revived, liveCalls atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				// Even goroutines check expired ids (2..), odd ones a live key.
				if g%2 == 0 {
					id := fmt.Sprint("id-", 2+g/2+4*i)
					if 2+g/2+4*i > expired {
						continue
					}
					res, err := l.Allow(ctx, old, id)
					if err != nil || !res.Allowed || res.Used != 1 {
						errs <- fmt.Errorf("Allow(old, %s) during purge = %+v, %v; want a fresh window", id, res, err)
						return
					}
					revived.Add(1)
				} else {
					if _, err := l.Allow(ctx, live, "hot"); err != nil {
						errs <- fmt.Errorf("Allow(live) during purge: %v", err)
						return
					}
					liveCalls.Add(1)
				}
			}
		}()
	}
	n, err := store.Purge(ctx, time.Now(), 1000)
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	var left int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM count_limit WHERE use_type = 'old'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	// Every old row was purged, or checked during the purge (which left one
	// fresh window, whether the check came before the purge or after it), or
	// locked by the open transaction.
	if left != revived.Load()+1 {
		t.Errorf("%d old rows left; want the %d checked during the purge and the 1 locked", left, revived.Load())
	}
	var stale int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM count_limit WHERE use_type = 'old' AND unique_id <> 'id-1'
		AND (already_count <> 1 OR end_time <= now())`).Scan(&stale); err != nil || stale != 0 {
		t.Errorf("%d rows left are not one fresh count (%v)", stale, err)
	}
	if n > expired-1 || n < expired-1-revived.Load() {
		t.Errorf("purged %d rows; want between %d and %d", n, expired-1-revived.Load(), expired-1)
	}
	if liveCalls.Load() == 0 || revived.Load() == 0 {
		t.Errorf("no checks ran beside the purge (live %d, revived %d)", liveCalls.Load(), revived.Load())
	}
	t.Logf("purged %d rows in batches of 1000 beside %d live checks and %d checks on purged ids", n, liveCalls.Load(), revived.Load())
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := store.Purge(ctx, time.Now(), 1000); err != nil || n != 1 {
		t.Errorf("Purge after the lock is released: %d, %v; want the 1 row it skipped", n, err)
	}
}

// TestStatusCountsAWindowThatBeginsLater: a Limiter whose clock runs ahead
// of the database's opens a window that begins after now(); the view
// counts its events all the same, as every check does (a window is current
// while it is not empty and not over).
func TestStatusCountsAWindowThatBeginsLater(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	ahead := countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return time.Now().Add(time.Minute) }))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "status.ahead"), Limit: 5, Window: countlimit.Rolling(time.Hour)}
	if _, err := ahead.AllowN(ctx, rule, "u", 2); err != nil {
		t.Fatal(err)
	}
	var used, remaining int64
	if err := pool.QueryRow(ctx, `SELECT used, remaining FROM count_limit_status WHERE use_type = $1 AND unique_id = 'u'`,
		string(rule.UseType)).Scan(&used, &remaining); err != nil || used != 2 || remaining != 3 {
		t.Errorf("count_limit_status: used %d, remaining %d (%v); want 2 and 3", used, remaining, err)
	}
}
