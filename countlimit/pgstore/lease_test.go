package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/service/audit"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestLeasesForDBAs: the status view shows a concurrent key's live leases
// as its used slots, and the audit queries list it.
func TestLeasesForDBAs(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	store := pgstore.New(pool)
	l := countlimit.New(store)
	rule := countlimit.Rule{UseType: storetest.UseType(t, "lease.view"), Limit: 3, Window: countlimit.Concurrent(time.Hour)}
	var leases []countlimit.Lease
	for range 2 {
		lease, res, err := l.Acquire(ctx, rule, "dba-visible")
		if err != nil || !res.Allowed {
			t.Fatalf("Acquire = %+v, %v", res, err)
		}
		leases = append(leases, lease)
	}
	view := func(step string, wantUsed int64) {
		t.Helper()
		var (
			kind            string
			used, remaining int64
			end             time.Time
			resetsIn        time.Duration
		)
		err := pool.QueryRow(ctx, `SELECT window_kind, used, remaining, window_end, resets_in
			FROM count_limit_status WHERE use_type = $1 AND unique_id = 'dba-visible'`, string(rule.UseType)).
			Scan(&kind, &used, &remaining, &end, &resetsIn)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if kind != "concurrent" || used != wantUsed || remaining != rule.Limit-wantUsed ||
			time.Until(end) < 59*time.Minute || resetsIn < 59*time.Minute {
			t.Errorf("%s: count_limit_status = kind %s used %d remaining %d ends %v (in %v); want concurrent %d %d in ~1h",
				step, kind, used, remaining, end, resetsIn, wantUsed, rule.Limit-wantUsed)
		}
	}
	view("2 held", 2)
	if err := leases[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	view("1 released", 1)
	top, err := audit.NearestLimit(ctx, pool, pgstore.MaxBatchSize)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range top {
		if s.UseType == string(rule.UseType) {
			found = s.WindowKind == "concurrent" && s.Used == 1 && s.Remaining == 2
		}
	}
	if !found {
		t.Errorf("NearestLimit does not list the concurrent key with 1 slot held")
	}
}

// TestPurgeLeases: purge deletes expired leases, and rows that hold only
// expired leases, and keeps a row whose lease is live even though it
// counts nothing.
func TestPurgeLeases(t *testing.T) {
	pool := testbackend.FreshSchema(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := storetest.NewClock(t0)
	store := pgstore.New(pool)
	l := countlimit.New(store, countlimit.WithClock(clock.Now))
	slots := countlimit.Rule{UseType: "purge.slots", Limit: 2, Window: countlimit.Concurrent(time.Minute)}
	forever := countlimit.Rule{UseType: "purge.slots", Limit: 1, Window: countlimit.Lifetime()}
	acquire := func(id string) {
		t.Helper()
		if _, res, err := l.Acquire(ctx, slots, id); err != nil || !res.Allowed {
			t.Fatalf("Acquire(%s) = %+v, %v", id, res, err)
		}
	}
	acquire("expired")
	acquire("expired")
	// A row that counts forever and held a lease: the row stays, the lease goes.
	if _, err := l.Allow(ctx, forever, "counted"); err != nil {
		t.Fatal(err)
	}
	acquire("counted")
	clock.Set(t0.Add(time.Hour))
	acquire("live")

	n, err := store.Purge(ctx, clock.Now(), 1)
	if err != nil {
		t.Fatal(err)
	}
	// The "expired" row, and 3 leases deleted by themselves or with it.
	if n < 2 || n > 4 {
		t.Errorf("Purge deleted %d rows and leases, want 2 to 4", n)
	}
	rows := func(query string) string {
		t.Helper()
		r, err := pool.Query(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got)
	}
	if got := rows(`SELECT unique_id FROM count_limit ORDER BY 1`); got != "[counted live]" {
		t.Errorf("rows left after purge: %s, want [counted live]", got)
	}
	if got := rows(`SELECT unique_id FROM count_limit_lease ORDER BY 1`); got != "[live]" {
		t.Errorf("leases left after purge: %s, want [live]", got)
	}
	if res, err := l.Peek(ctx, slots, "live"); err != nil || res.Used != 1 {
		t.Errorf("Peek(live) after purge = %+v, %v; want 1 slot held", res, err)
	}
	if res, err := l.Peek(ctx, forever, "counted"); err != nil || res.Used != 1 {
		t.Errorf("Peek(counted) after purge = %+v, %v; want its count kept", res, err)
	}
}

// TestLeaseOneStatementPerCall: Acquire, Extend, Release and Peek of a
// Concurrent rule are one statement each, on a pool and in a transaction,
// once the Store has looked at where its connections go (its first
// statement, or the process's on that address, may bring one more).
func TestLeaseOneStatementPerCall(t *testing.T) {
	cfg := testbackend.PoolConfig(t)
	tracer := &counter{}
	cfg.ConnConfig.Tracer = tracer
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for name, s := range map[string]*pgstore.Store{"pool": pgstore.New(pool), "tx": pgstore.New(tx)} {
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		l := countlimit.New(s)
		rule := countlimit.Rule{UseType: storetest.UseType(t, "lease.one."+name), Limit: 1, Window: countlimit.Concurrent(time.Minute), Block: time.Second}
		var lease countlimit.Lease
		calls := []struct {
			name string
			call func() error
		}{
			{"Acquire (new row)", func() (err error) { lease, _, err = l.Acquire(ctx, rule, "u"); return err }},
			{"Acquire denied", func() error { _, _, err := l.Acquire(ctx, rule, "u"); return err }},
			{"Extend", func() error { return lease.Extend(ctx) }},
			{"Peek", func() error { _, err := l.Peek(ctx, rule, "u"); return err }},
			{"Release", func() error { return lease.Release(ctx) }},
			{"Reset", func() error { return l.Reset(ctx, rule, "u") }},
		}
		for _, c := range calls {
			before := tracer.n.Load()
			if err := c.call(); err != nil {
				t.Fatalf("%s: %s: %v", name, c.name, err)
			}
			if got := tracer.n.Load() - before; got != 1 {
				t.Errorf("%s: %s sent %d statements, want exactly 1", name, c.name, got)
			}
		}
	}
}

// TestConcurrentPurgesOfLeases: purges running at once over many keys with
// expired leases never deadlock (a row's cascade to its leases used to wait
// on leases another purge held) and leave nothing expired behind.
func TestConcurrentPurgesOfLeases(t *testing.T) {
	pool := testbackend.FreshSchema(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, seed := range []string{`
		INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value, lease_until)
		SELECT 'purge.race', 'id-' || i, $1, $1, 2, $1 FROM generate_series(1, 4000) i`, `
		INSERT INTO count_limit_lease (use_type, unique_id, lease_token, expires_at, taken_at)
		SELECT 'purge.race', 'id-' || i, 'token-' || i || '-' || j, $1, $1
		FROM generate_series(1, 4000) i, generate_series(1, 2) j`} {
		if _, err := pool.Exec(ctx, seed, t0); err != nil {
			t.Fatal(err)
		}
	}
	store := pgstore.New(pool)
	now := t0.Add(time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := store.Purge(ctx, now, 100); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent purge: %v", err)
	}
	if _, err := store.Purge(ctx, now, 100); err != nil { // what the racing purges skipped
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM count_limit) + (SELECT count(*) FROM count_limit_lease)`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d rows and leases left after purging, want 0", left)
	}
}

// TestDeniedAcquireInCallersTx: a denied Acquire on a Store over the
// caller's transaction leaves that transaction's synchronous_commit alone
// (only a call that is a transaction of its own may commit its denial tally
// without waiting for the flush), and so does one over a plain connection,
// which may be inside a transaction begun in SQL.
func TestDeniedAcquireInCallersTx(t *testing.T) { deniedAcquireInCallersTx(t, testbackend.Postgres(t)) }

// deniedAcquireInCallersTx runs the test on pool. Its own statements
// prepare nothing, so that it runs behind a transaction pooler too.
func deniedAcquireInCallersTx(t *testing.T, pool *pgxpool.Pool) {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "ROLLBACK")
	// On whatever the server's default, so that off afterwards is the
	// Acquire's doing.
	for _, d := range []pgstore.DBTX{tx, conn.Conn()} {
		if _, err := d.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
			t.Fatal(err)
		}
	}
	for name, d := range map[string]pgstore.DBTX{"tx": tx, "conn in BEGIN": conn.Conn()} {
		l := countlimit.New(pgstore.New(d))
		rule := countlimit.Rule{UseType: storetest.UseType(t, "lease.tx."+strings.ReplaceAll(name, " ", "_")), Limit: 1, Window: countlimit.Concurrent(time.Minute)}
		if _, res, err := l.Acquire(ctx, rule, "u"); err != nil || !res.Allowed {
			t.Fatalf("%s: first Acquire = %+v, %v; want allowed", name, res, err)
		}
		if _, res, err := l.Acquire(ctx, rule, "u"); err != nil || res.Allowed {
			t.Fatalf("%s: second Acquire = %+v, %v; want denied", name, res, err)
		}
		var sc string
		if err := d.QueryRow(ctx, "SHOW synchronous_commit", pgx.QueryExecModeExec).Scan(&sc); err != nil {
			t.Fatal(err)
		}
		if sc != "on" {
			t.Errorf("%s: synchronous_commit after a denied Acquire = %q, want on", name, sc)
		}
	}
}
