package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestAllowOneIsExactOnItsOwn sends 16 goroutines, each on a connection of
// its own (one statement per call, no group commit), at one id that does
// not exist yet, limit 100: the row is created under contention, exactly
// 100 calls are allowed with Used 1..100, and every denial is tallied.
func TestAllowOneIsExactOnItsOwn(t *testing.T) {
	cfg := testbackend.PoolConfig(t)
	rule := countlimit.Rule{UseType: storetest.UseType(t, "one.exact"), Limit: 100, Window: countlimit.Rolling(time.Hour)}
	const callers, each = 16, 16
	ctx := context.Background()
	limiters := make([]*countlimit.Limiter, callers)
	for i := range limiters {
		conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		limiters[i] = countlimit.New(pgstore.New(conn))
	}
	denied := testbackend.AllAtOnce(t, callers, each, 100, func(i int) (countlimit.Result, error) { return limiters[i].Allow(ctx, rule, "hot") })
	var tally int64
	err := testbackend.Postgres(t).QueryRow(ctx, `SELECT denied_count FROM count_limit WHERE use_type = $1 AND unique_id = 'hot'`,
		string(rule.UseType)).Scan(&tally)
	if err != nil || tally != int64(denied) {
		t.Errorf("%d denied, %d tallied (%v)", denied, tally, err)
	}
}

// TestAllowOneDecidesOnTheLatestRow changes a row in a transaction while
// AllowOne waits for it: the decision follows the committed change, not the
// statement's snapshot, in both directions.
func TestAllowOneDecidesOnTheLatestRow(t *testing.T) {
	for _, tc := range []struct {
		name        string
		before      int64 // the count the call's snapshot sees
		after       int64 // the count committed while it waits
		allowed     bool
		used        int64
		deniedCount int64
	}{
		// The snapshot's row is full, so the UPDATE passes it by; the
		// denial path then waits for the lock, finds room and writes
		// nothing, and the call is sent again.
		{"full, then emptied", 3, 0, true, 1, 0},
		// The snapshot's row has room; the UPDATE waits, reads the row
		// again, finds it full and passes it by; the denial path tallies.
		{"room, then filled", 1, 3, false, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := testbackend.Postgres(t)
			// On a connection of its own: on a pool, a lone call never
			// waits for another transaction's row lock.
			conn, err := pgx.ConnectConfig(context.Background(), testbackend.PoolConfig(t).ConnConfig.Copy())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close(context.Background()) })
			l := countlimit.New(pgstore.New(conn))
			rule := countlimit.Rule{UseType: storetest.UseType(t, "one.latest"), Limit: 3, Window: countlimit.Rolling(time.Hour)}
			ctx := context.Background()
			if _, err := l.AllowN(ctx, rule, "z", tc.before); err != nil {
				t.Fatal(err)
			}
			b := begin(t, admin)
			if _, err := b.tx.Exec(ctx, `UPDATE count_limit SET already_count = $2 WHERE use_type = $1 AND unique_id = 'z'`,
				string(rule.UseType), tc.after); err != nil {
				t.Fatal(err)
			}
			got := goAllow(ctx, l, rule, "z")
			b.waiter(t, admin)
			if err := b.tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			o := <-got
			if o.err != nil || o.res.Allowed != tc.allowed || o.res.Used != tc.used {
				t.Errorf("Allow: %+v, %v; want allowed %v, Used %d", o.res, o.err, tc.allowed, tc.used)
			}
			var n, den int64
			err = admin.QueryRow(ctx, `SELECT already_count, denied_count FROM count_limit WHERE use_type = $1 AND unique_id = 'z'`,
				string(rule.UseType)).Scan(&n, &den)
			if err != nil || n != tc.used || den != tc.deniedCount {
				t.Errorf("row: already_count %d, denied_count %d (%v); want %d, %d", n, den, err, tc.used, tc.deniedCount)
			}
		})
	}
}

// TestAllowOneInRepeatableReadAfterReset pins what the statement's comment
// says of a caller's REPEATABLE READ transaction whose row a concurrent
// Reset deleted after its snapshot: with room in the snapshot the call
// fails (a serialization error: the UPDATE meets the deletion); full in the
// snapshot, it is counted afresh, as the row now is.
func TestAllowOneInRepeatableReadAfterReset(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before int64 // the count the snapshot sees, of a limit of 2
		fails  bool
	}{
		{"room in the snapshot", 1, true},
		{"full in the snapshot", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testbackend.Postgres(t)
			ctx := context.Background()
			rule := countlimit.Rule{UseType: storetest.UseType(t, "one.rr"), Limit: 2, Window: countlimit.Rolling(time.Hour)}
			l := countlimit.New(pgstore.New(pool))
			if _, err := l.AllowN(ctx, rule, "z", tc.before); err != nil {
				t.Fatal(err)
			}
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot
				t.Fatal(err)
			}
			if err := l.Reset(ctx, rule, "z"); err != nil {
				t.Fatal(err)
			}
			res, err := countlimit.New(pgstore.New(tx)).Allow(ctx, rule, "z")
			switch {
			case tc.fails && (err == nil || !strings.Contains(err.Error(), "40001")):
				t.Errorf("Allow: %+v, %v; want a serialization error (SQLSTATE 40001)", res, err)
			case !tc.fails && (err != nil || !res.Allowed || res.Used != 1):
				t.Errorf("Allow: %+v, %v; want allowed with Used 1", res, err)
			}
		})
	}
}
