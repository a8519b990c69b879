package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestApplyLocksARowCreatedBesideIt: countlimit_apply finds its row
// absent while another transaction has just created it and not committed.
// Its insert waits for that transaction (ON CONFLICT), finds the row there
// once it commits, and locks it at the next attempt: the call counts on top
// of the other's event, as if it had come after it, and neither is lost.
// Both calls are AllowAll of a sliding and a fixed rule, on connections
// that wait for locks (a Store on a transaction, and one on a connection).
func TestApplyLocksARowCreatedBesideIt(t *testing.T) {
	ctx := context.Background()
	pool := testbackend.Postgres(t)
	ut := storetest.UseType(t, "created.beside")
	sliding := countlimit.Rule{UseType: ut + ".sliding", Limit: 5, Window: countlimit.Sliding(time.Hour)}
	fixed := countlimit.Rule{UseType: ut + ".fixed", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	const id = "new"

	first := begin(t, pool)
	if r, err := countlimit.New(pgstore.New(first.tx)).AllowAll(ctx, id, sliding, fixed); err != nil || !r[0].Allowed || r[0].Used != 1 || r[1].Used != 1 {
		t.Fatalf("first AllowAll, uncommitted: %+v, %v", r, err)
	}

	conn, err := pgx.ConnectConfig(ctx, testbackend.PoolConfig(t).ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	type outcome struct {
		res []countlimit.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := countlimit.New(pgstore.New(conn)).AllowAll(ctx, id, sliding, fixed)
		done <- outcome{r, err}
	}()
	first.waiter(t, pool) // the second call's insert waits for the first's
	if err := first.tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-done:
		if o.err != nil || len(o.res) != 2 || !o.res[0].Allowed {
			t.Fatalf("second AllowAll: %+v, %v; want allowed", o.res, o.err)
		}
		for i, r := range o.res {
			if r.Used != 2 {
				t.Errorf("second AllowAll, rule %d: Used %d, want 2 (the first call's event and its own)", i, r.Used)
			}
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second AllowAll did not finish after the first committed")
	}
	for _, rule := range []countlimit.Rule{sliding, fixed} {
		var count int64
		if err := pool.QueryRow(ctx, `SELECT already_count FROM count_limit WHERE use_type = $1 AND unique_id = $2`,
			string(rule.UseType), id).Scan(&count); err != nil || count != 2 {
			t.Errorf("%s: already_count %d (%v), want 2", rule.UseType, count, err)
		}
	}
}
