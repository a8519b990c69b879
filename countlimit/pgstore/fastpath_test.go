package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestFastPathRunsAloneOnFreeRows:
// countlimit_allow_one_pooled and countlimit_allow_distinct_pooled, which
// pgstore's pool calls, decide calls whose rows exist and are free by a
// statement of their own, and call 00001's whole statement
// (countlimit_allow_one, countlimit_allow_distinct) only when a row is
// absent or another transaction holds it. The
// model harness holds both paths to model.Apply; this test holds the
// choice of path, which the answers alone cannot show: PostgreSQL counts
// each function's calls (track_functions, a superuser's setting).
func TestFastPathRunsAloneOnFreeRows(t *testing.T) {
	ctx := context.Background()
	ut := string(storetest.UseType(t, "fastpath"))
	tx := trackedTx(t)
	// calls reports how many times this transaction has called each
	// whole statement so far.
	calls := func() (one, distinct int64) {
		t.Helper()
		err := tx.QueryRow(ctx, `SELECT
				coalesce(sum(calls) FILTER (WHERE funcname = 'countlimit_allow_one'), 0),
				coalesce(sum(calls) FILTER (WHERE funcname = 'countlimit_allow_distinct'), 0)
			FROM pg_stat_xact_user_functions`).Scan(&one, &distinct)
		if err != nil {
			t.Fatal(err)
		}
		return one, distinct
	}
	allowOne := func(id string, limit int64) bool {
		t.Helper()
		var allowed bool
		err := tx.QueryRow(ctx, `SELECT o_allowed FROM countlimit_allow_one_pooled($1, $2, now(), 1, $3, now(),
			now() + interval '1 hour', now() + interval '1 minute', 'fixed')`, ut, id, limit).Scan(&allowed)
		if err != nil {
			t.Fatal(err)
		}
		return allowed
	}
	allowDistinct := func(ids ...string) int {
		t.Helper()
		n := len(ids)
		uts := make([]string, n)
		for i := range uts {
			uts[i] = ut
		}
		rows, err := tx.Query(ctx, `SELECT o_key_of FROM countlimit_allow_distinct_pooled($1, $2,
			array_fill(now(), ARRAY[$3::int]), array_fill(1::bigint, ARRAY[$3::int]), array_fill(10::bigint, ARRAY[$3::int]),
			array_fill(now(), ARRAY[$3::int]), array_fill(now() + interval '1 hour', ARRAY[$3::int]),
			array_fill(NULL::timestamptz, ARRAY[$3::int]), array_fill('fixed'::text, ARRAY[$3::int]))`, uts, ids, n)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}

	steps := []struct {
		name          string
		do            func()
		one, distinct int64 // the whole statements' calls after the step
	}{
		{"a new id: the whole statement inserts it", func() { allowOne("a", 2) }, 1, 0},
		{"its row, free: the fast statement alone", func() {
			if !allowOne("a", 2) {
				t.Error("second call of a, limit 2: denied")
			}
		}, 1, 0},
		{"its row, full: the fast statement denies", func() {
			if allowOne("a", 2) {
				t.Error("third call of a, limit 2: allowed")
			}
		}, 1, 0},
		{"a batch with a new id: the whole batch statement", func() {
			if got := allowDistinct("a", "b"); got != 2 {
				t.Errorf("batch of a, b: %d rows, want 2", got)
			}
		}, 1, 1},
		{"a batch of rows that exist: the fast batch statement", func() {
			if got := allowDistinct("a", "b"); got != 2 {
				t.Errorf("batch of a, b again: %d rows, want 2", got)
			}
		}, 1, 1},
	}
	for _, s := range steps {
		s.do()
		if one, distinct := calls(); one != s.one || distinct != s.distinct {
			t.Errorf("%s: the whole statements called %d and %d times in all, want %d and %d",
				s.name, one, distinct, s.one, s.distinct)
		}
	}
	// And what the fast statements wrote is what the whole one would
	// have: a's two calls allowed at limit 2, the third denied with its
	// penalty (a minute), and the batches' two calls denied by it.
	var used, denied int64
	var penalty bool
	if err := tx.QueryRow(ctx, `SELECT already_count, denied_count, blocked_until = now() + interval '1 minute'
		FROM count_limit WHERE use_type = $1 AND unique_id = 'a'`, ut).Scan(&used, &denied, &penalty); err != nil {
		t.Fatal(err)
	}
	if used != 2 || denied != 3 || !penalty {
		t.Errorf("a's row: used %d, denied %d, penalty set %v; want 2, 3 and true", used, denied, penalty)
	}
}

// TestPooledStatementsWaitBrieflyForTheTable: with count_limit locked as a
// whole (an ALTER TABLE's or a DBA's LOCK TABLE), the pool's statements
// give up after countlimit_lock_briefly's wait with lock_not_available, as
// 00001's do, and pgstore routes the call as before
// (TestLockedTableIsAnOutage); without it the first statement of
// a _pooled function would wait for the table at the session's lock_timeout,
// for ever by default, and the call would end only at its deadline.
func TestPooledStatementsWaitBrieflyForTheTable(t *testing.T) {
	// A schema of its own: the lock on the table stalls no other test.
	pool := testbackend.FreshSchema(t)
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	ut := string(storetest.UseType(t, "fastpath.table"))
	b := begin(t, pool)
	if _, err := b.tx.Exec(context.Background(), `LOCK TABLE count_limit IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	defer b.release(t)
	for _, call := range []string{
		`SELECT count(*) FROM countlimit_allow_one_pooled($1, 'a', now(), 1, 10, now(), now() + interval '1 hour', NULL, 'fixed')`,
		`SELECT count(*) FROM countlimit_allow_distinct_pooled(ARRAY[$1::text], ARRAY['a'], ARRAY[now()], ARRAY[1::bigint],
			ARRAY[10::bigint], ARRAY[now()], ARRAY[now() + interval '1 hour'], ARRAY[NULL::timestamptz], ARRAY['fixed'])`,
	} {
		// The deadline only ends a wait that should not happen.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := pool.QueryRow(ctx, call, ut).Scan(new(int64))
		cancel()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55P03" {
			t.Errorf("%s with the table locked: %v; want lock_not_available (55P03)", call[:43], err)
		}
	}
}

// TestFastBatchRunsAloneWhenEveryCallFits:
// countlimit_allow_batch_pooled, the pool's group commit for a batch with a
// key more than once (a hot id), decides by a statement of its own (a
// running sum per key) when every row exists, is free and has room for
// every call, and calls 00001's countlimit_allow_batch (a fold, a step a
// call) otherwise, as PostgreSQL's own count of each function's calls
// shows (track_functions). The answers and the rows must be the fold's:
// the model harness holds that on random batches; here the counts at
// each call are checked too.
func TestFastBatchRunsAloneWhenEveryCallFits(t *testing.T) {
	ctx := context.Background()
	ut := string(storetest.UseType(t, "fastbatch"))
	tx := trackedTx(t)
	folds := func() (n int64) {
		t.Helper()
		if err := tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
			WHERE funcname = 'countlimit_allow_batch'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// batch sends calls of 1 each on the ids of keys (each once, in
	// order), of[i] naming call i's key (1-based), at limit lim, and
	// returns each call's allowed and used, in key and call order.
	batch := func(keys []string, of []int32, lim int64) (allowed []bool, used []int64) {
		t.Helper()
		uts := make([]string, len(keys))
		kinds := make([]string, len(keys))
		for i := range keys {
			uts[i], kinds[i] = ut, "fixed"
		}
		seq := make([]int32, len(of))
		count := map[int32]int32{}
		for i, k := range of {
			count[k]++
			seq[i] = count[k]
		}
		rows, err := tx.Query(ctx, `SELECT o_allowed, o_used FROM countlimit_allow_batch_pooled($1, $2, $3, $4,
			array_fill(now(), ARRAY[$5::int]), array_fill(1::bigint, ARRAY[$5::int]), array_fill($6::bigint, ARRAY[$5::int]),
			array_fill(now(), ARRAY[$5::int]), array_fill(now() + interval '1 hour', ARRAY[$5::int]),
			array_fill(NULL::timestamptz, ARRAY[$5::int]), $7)`, uts, keys, of, seq, len(of), lim, kinds)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var a bool
			var u int64
			if err := rows.Scan(&a, &u); err != nil {
				t.Fatal(err)
			}
			allowed, used = append(allowed, a), append(used, u)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return allowed, used
	}
	steps := []struct {
		name    string
		keys    []string
		of      []int32
		lim     int64
		allowed string
		used    string
		folds   int64 // countlimit_allow_batch's calls after the step
	}{
		{"new ids: the fold inserts them", []string{"g", "h"}, []int32{1, 2, 2}, 5, "[true true true]", "[1 1 2]", 1},
		{"rows that exist with room for every call: the running sum alone", []string{"g", "h"}, []int32{2, 1, 2, 2}, 5,
			"[true true true true]", "[2 3 4 5]", 1},
		{"a call without room: the fold", []string{"h"}, []int32{1, 1}, 6, "[true false]", "[6 6]", 2},
		{"room again under a higher limit: the running sum alone", []string{"g", "h"}, []int32{1, 1, 2}, 8,
			"[true true true]", "[3 4 7]", 2},
	}
	for _, s := range steps {
		allowed, used := batch(s.keys, s.of, s.lim)
		if got := fmt.Sprint(allowed); got != s.allowed {
			t.Errorf("%s: allowed %s, want %s", s.name, got, s.allowed)
		}
		if got := fmt.Sprint(used); got != s.used {
			t.Errorf("%s: used %s, want %s", s.name, got, s.used)
		}
		if n := folds(); n != s.folds {
			t.Errorf("%s: countlimit_allow_batch called %d times in all, want %d", s.name, n, s.folds)
		}
	}
	var g, h, hDenied, hLimit int64
	if err := tx.QueryRow(ctx, `SELECT
			max(already_count) FILTER (WHERE unique_id = 'g'), max(already_count) FILTER (WHERE unique_id = 'h'),
			max(denied_count) FILTER (WHERE unique_id = 'h'), max(limit_value) FILTER (WHERE unique_id = 'h')
		FROM count_limit WHERE use_type = $1`, ut).Scan(&g, &h, &hDenied, &hLimit); err != nil {
		t.Fatal(err)
	}
	if g != 4 || h != 7 || hDenied != 1 || hLimit != 8 {
		t.Errorf("rows: g %d, h %d (denied %d, limit %d); want 4, 7 (1, 8)", g, h, hDenied, hLimit)
	}
}

// trackedTx begins a transaction on the test database, rolled back when
// the test ends, in which PostgreSQL counts each PL/pgSQL function's calls
// (track_functions, pg_stat_xact_user_functions); it skips the test where
// that setting needs a superuser the test is not.
func trackedTx(t *testing.T) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := testbackend.Postgres(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `SET LOCAL track_functions = 'pl'`); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
			t.Skip("track_functions needs a superuser:", err)
		}
		t.Fatal(err)
	}
	return tx
}
