package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestGroupCommitIsExact sends 64 concurrent callers at one id with limit
// 100 through group commit: exactly 100 are allowed, and their Used values
// are 1 to 100, each once, as if they had run one after another.
func TestGroupCommitIsExact(t *testing.T) {
	groupCommitIsExact(t, testbackend.PoolConfig(t), testbackend.Postgres(t))
}

// groupCommitIsExact runs the test on a pool of cfg, and reads the row
// through admin.
func groupCommitIsExact(t *testing.T, cfg *pgxpool.Config, admin *pgxpool.Pool) {
	pool, tracer := tracedPool(t, cfg)
	l := countlimit.New(pgstore.New(pool))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "exact"), Limit: 100, Window: countlimit.Rolling(time.Hour)}

	const callers, each = 64, 4
	ctx := context.Background()
	sending := tracer.n.Load()
	denied := testbackend.AllAtOnce(t, callers, each, 100, func(int) (countlimit.Result, error) { return l.Allow(ctx, rule, "hot") })
	// What the DBA sees of the row the batches wrote.
	var used, remaining, den int64
	err := admin.QueryRow(ctx, `SELECT used, remaining, denied_count FROM count_limit_status
		WHERE use_type = $1 AND unique_id = 'hot'`, string(rule.UseType)).Scan(&used, &remaining, &den)
	if err != nil || used != 100 || remaining != 0 || den != int64(denied) {
		t.Errorf("count_limit_status: used %d remaining %d denied %d (%v); want 100, 0, %d", used, remaining, den, err, denied)
	}
	if n := tracer.n.Load() - sending; n >= callers*each {
		t.Errorf("%d calls sent %d statements: nothing was batched", callers*each, n)
	} else {
		t.Logf("%d calls in %d statements", callers*each, n)
	}
}

// blocker holds row locks in a transaction of its own, so that a test can
// stop a statement on them.
type blocker struct {
	tx  pgx.Tx
	pid int32
}

// begin starts the blocker's transaction; it is rolled back when the test
// ends unless it was committed or released first.
func begin(t *testing.T, pool *pgxpool.Pool) *blocker {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	b := &blocker{tx: tx}
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&b.pid); err != nil {
		t.Fatal(err)
	}
	return b
}

func lockRows(t *testing.T, pool *pgxpool.Pool, ut countlimit.UseType, ids ...string) *blocker {
	t.Helper()
	b := begin(t, pool)
	tag, err := b.tx.Exec(context.Background(), `SELECT FROM count_limit WHERE use_type = $1 AND unique_id = ANY ($2) FOR UPDATE`, string(ut), ids)
	if err != nil || tag.RowsAffected() != int64(len(ids)) {
		t.Fatalf("locking %v: %v, %d rows", ids, err, tag.RowsAffected())
	}
	return b
}

// waiter waits until a backend waits for b's locks and returns its pid.
func (b *blocker) waiter(t *testing.T, pool *pgxpool.Pool) int32 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var pid int32
		err := pool.QueryRow(context.Background(),
			`SELECT pid FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)) LIMIT 1`, b.pid).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("no statement came to wait for the test's row lock")
	return 0
}

func (b *blocker) release(t *testing.T) {
	t.Helper()
	if err := b.tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}

type outcome struct {
	res countlimit.Result
	err error
}

func goAllow(ctx context.Context, l *countlimit.Limiter, rule countlimit.Rule, id string) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		res, err := l.Allow(ctx, rule, id)
		ch <- outcome{res, err}
	}()
	return ch
}

// insertRows inserts rows for ids in a transaction of its own, not
// committed: a statement that inserts one of those keys waits for it. (A
// batch skips a row another transaction holds locked, but nothing can skip
// an insert's conflict.)
func insertRows(t *testing.T, pool *pgxpool.Pool, ut countlimit.UseType, ids ...string) *blocker {
	t.Helper()
	b := begin(t, pool)
	_, err := b.tx.Exec(context.Background(), `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value)
		SELECT $1, id, 0, now(), now(), 0 FROM unnest($2::text[]) AS id`, string(ut), ids)
	if err != nil {
		t.Fatalf("inserting %v: %v", ids, err)
	}
	return b
}

// patientPool is a pool of its own on the tests' schema whose statements
// wait a minute for a lock instead of giving up at once and waiting in the
// process: a batch that meets a row another transaction inserted then
// stays in flight, as these tests need. countlimit.lock_wait cannot say a
// minute (it is held to 100 ms), so the pool's search path finds, before
// the tests' schema, a schema of its own whose countlimit_lock_briefly
// sets lock_timeout to a minute.
func patientPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	patient := testbackend.FreshSchema(t)
	var schema string
	if err := patient.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if _, err := patient.Exec(ctx, `CREATE FUNCTION countlimit_lock_briefly() RETURNS text LANGUAGE sql
		AS $$ SELECT set_config('lock_timeout', '1min', true) $$`); err != nil {
		t.Fatal(err)
	}
	cfg := testbackend.PoolConfig(t)
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize() + ", " + cfg.ConnConfig.RuntimeParams["search_path"]
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var wait string
	if err := pool.QueryRow(ctx, `SELECT countlimit_lock_briefly(), current_setting('lock_timeout')`).Scan(new(string), &wait); err != nil || wait != "1min" {
		t.Fatalf("the patient pool's lock_timeout: %q, %v; want 1min", wait, err)
	}
	return pool
}

// stalled sends a call for id z, which has no row yet, that stops in
// flight: admin has inserted z's row in a transaction not yet committed.
// Release b (a rollback) to let it go on: z's row is then the call's own.
func stalled(t *testing.T, admin *pgxpool.Pool, l *countlimit.Limiter, rule countlimit.Rule) (b *blocker, first <-chan outcome) {
	t.Helper()
	b = insertRows(t, admin, rule.UseType, "z")
	first = goAllow(context.Background(), l, rule, "z")
	b.waiter(t, admin)
	return b, first
}

// TestFailedBatchCommitsNothing stops a group commit on a row lock, kills
// its connection, and checks that every caller in it got ErrUnavailable
// and that none of its counts was committed.
func TestFailedBatchCommitsNothing(t *testing.T) {
	admin := testbackend.Postgres(t)
	// One batch in flight, so that the calls below queue behind the first.
	s := pgstore.New(patientPool(t), pgstore.WithMaxInFlight(1))
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: storetest.UseType(t, "killed"), Limit: 100, Window: countlimit.Rolling(time.Hour)}
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := l.Allow(ctx, rule, id); err != nil {
			t.Fatal(err)
		}
	}
	// The first call is in flight, stopped on z1's insert; four calls
	// gather behind it.
	b1 := insertRows(t, admin, rule.UseType, "z1")
	b2 := insertRows(t, admin, rule.UseType, "z2")
	first := goAllow(ctx, l, rule, "z1")
	b1.waiter(t, admin)
	batch := map[string]<-chan outcome{}
	for _, id := range []string{"a", "b", "c", "z2"} {
		batch[id] = goAllow(ctx, l, rule, id)
	}
	waitQueued(t, s, 4)
	// They leave as one batch, which locks a, b, c and stops on z2's
	// insert.
	b1.release(t)
	if o := <-first; o.err != nil || o.res.Used != 1 {
		t.Fatalf("first call: %+v, %v", o.res, o.err)
	}
	victim := b2.waiter(t, admin)
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1)`, victim); err != nil {
		t.Fatal(err)
	}
	for id, ch := range batch {
		if o := <-ch; !errors.Is(o.err, countlimit.ErrUnavailable) {
			t.Errorf("%s in the killed batch: %+v, %v; want ErrUnavailable", id, o.res, o.err)
		}
	}
	b2.release(t)
	for id, want := range map[string]int64{"a": 1, "b": 1, "c": 1, "z2": 0} {
		if r, err := l.Peek(ctx, rule, id); err != nil || r.Used != want {
			t.Errorf("%s after the killed batch: Used %d, %v; want %d (nothing of the batch committed)", id, r.Used, err, want)
		}
	}
}

// TestCancelledWaiterLeavesNoCount cancels a call while it waits for a
// group commit: it is never sent, and nothing is counted.
func TestCancelledWaiterLeavesNoCount(t *testing.T) {
	admin := testbackend.Postgres(t)
	// One batch in flight, so that the call below queues behind the first.
	s := pgstore.New(patientPool(t), pgstore.WithMaxInFlight(1))
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: storetest.UseType(t, "cancelled"), Limit: 100, Window: countlimit.Rolling(time.Hour)}
	ctx := context.Background()
	b, first := stalled(t, admin, l, rule)

	cctx, cancel := context.WithCancel(ctx)
	waiting := goAllow(cctx, l, rule, "w")
	waitQueued(t, s, 1)
	cancel()
	if o := <-waiting; !errors.Is(o.err, context.Canceled) || !errors.Is(o.err, countlimit.ErrUnavailable) {
		t.Errorf("cancelled waiter: %+v, %v; want ErrUnavailable wrapping context.Canceled", o.res, o.err)
	}
	b.release(t)
	if o := <-first; o.err != nil {
		t.Fatal(o.err)
	}
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM count_limit WHERE use_type = $1 AND unique_id = 'w'`, string(rule.UseType)).Scan(&n); err != nil || n != 0 {
		t.Errorf("the cancelled waiter left %d rows (%v), want none", n, err)
	}
}

func waitQueued(t *testing.T, s *pgstore.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.QueuedForTest() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls wait for a group commit, want %d", s.QueuedForTest(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMixedTrafficNeverFails runs batched Allows, AllowAll over two rules
// (countlimit_apply), sliding Allows and Resets on the same few ids at once.
// Every statement takes its locks in the same three phases, so none
// deadlocks, and a Reset never makes a concurrent check fail. The traffic
// runs 2 s and, on a loaded machine, on until every kind of call has run
// 20 times.
func TestMixedTrafficNeverFails(t *testing.T) {
	mixedTrafficNeverFails(t, testbackend.PostgresPool(t), testbackend.PostgresPool(t))
}

// mixedTrafficNeverFails runs the traffic on two pools.
func mixedTrafficNeverFails(t *testing.T, pools ...*pgxpool.Pool) {
	hourly := countlimit.Rule{UseType: storetest.UseType(t, "mix.a"), Limit: 1 << 30, Window: countlimit.Fixed(time.Hour)}
	daily := countlimit.Rule{UseType: storetest.UseType(t, "mix.b"), Limit: 1 << 30, Window: countlimit.Rolling(24 * time.Hour)}
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "mix.c"), Limit: 10000, Window: countlimit.Sliding(time.Second)}
	ids := []string{"p", "q", "r"}
	kinds := []string{"Allow", "AllowAll", "sliding Allow", "Reset"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		counts = map[string]int{}
		start  = time.Now()
	)
	// running says, under mu, whether the traffic goes on.
	running := func() bool {
		if ctx.Err() != nil {
			return false
		}
		if time.Since(start) < 2*time.Second {
			return true
		}
		return slices.ContainsFunc(kinds, func(kind string) bool { return counts[kind] < 20 })
	}
	worker := func(kind string, w int, call func(l *countlimit.Limiter, id string) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := countlimit.New(pgstore.New(pools[w%2]))
			for i, more := w, true; more; i++ {
				err := call(l, ids[i%len(ids)])
				mu.Lock()
				if err != nil && ctx.Err() == nil {
					errs = append(errs, fmt.Errorf("%s: %w", kind, err))
				}
				counts[kind]++
				more = running()
				mu.Unlock()
			}
		}()
	}
	for w := range 8 {
		worker("Allow", w, func(l *countlimit.Limiter, id string) error {
			r := hourly
			if w%2 == 1 {
				r = daily
			}
			_, err := l.Allow(ctx, r, id)
			return err
		})
	}
	for w := range 4 {
		worker("AllowAll", w, func(l *countlimit.Limiter, id string) error {
			_, err := l.AllowAll(ctx, id, hourly, daily)
			return err
		})
		worker("sliding Allow", w, func(l *countlimit.Limiter, id string) error {
			_, err := l.Allow(ctx, sliding, id)
			return err
		})
	}
	for w := range 4 {
		worker("Reset", w, func(l *countlimit.Limiter, id string) error {
			for _, r := range []countlimit.Rule{hourly, daily, sliding} {
				if err := l.Reset(ctx, r, id); err != nil {
					return err
				}
			}
			return nil
		})
	}
	wg.Wait()
	for _, err := range errs[:min(len(errs), 5)] {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.Errorf("%d of the calls failed (%v)", len(errs), counts)
	}
	for _, kind := range kinds {
		if counts[kind] < 20 {
			t.Errorf("only %d %s calls ran: the test proves little (%v)", counts[kind], kind, counts)
		}
	}
	t.Logf("calls: %v", counts)
}

// TestBatchLeavesRowCreatedMeanwhile creates a row in a transaction of its
// own while a group commit waits to insert the same key: the batch counts
// its other calls, leaves that row as the transaction wrote it and asks for
// the call to be sent again, which then counts on that row. Both batch
// statements: calls with keys of their own, and a key repeated.
func TestBatchLeavesRowCreatedMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ids   []string
		usedA int64 // "a"'s count once the batch committed
	}{
		{"distinct keys", []string{"a", "new"}, 2},
		{"repeated keys", []string{"a", "new", "a"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := patientPool(t) // of its own: this test holds 3 connections at once
			s := pgstore.New(pool)
			rule := countlimit.Rule{UseType: storetest.UseType(t, "meanwhile"), Limit: 10, Window: countlimit.Rolling(time.Hour)}
			ctx := context.Background()
			if _, err := countlimit.New(s).Allow(ctx, rule, "a"); err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			for _, id := range tc.ids {
				if _, err := countlimit.New(rec).Allow(ctx, rule, id); err != nil {
					t.Fatal(err)
				}
			}
			b := begin(t, pool)
			if _, err := b.tx.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value)
				VALUES ($1, 'new', 5, now(), now() + interval '1 hour', 10)`, string(rule.UseType)); err != nil {
				t.Fatal(err)
			}

			sent := make(chan error, 1)
			go func() { sent <- s.AllowBatchForTest(ctx, rec.reqs) }()
			b.waiter(t, pool)
			if err := b.tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-sent; err == nil || !strings.Contains(err.Error(), "call 1: left for a retry") {
				t.Fatalf("batch over a row created meanwhile: %v, want call 1 left for a retry", err)
			}
			for _, c := range []struct {
				id   string
				used int64
			}{{"a", tc.usedA}, {"new", 5}} {
				if r, err := countlimit.New(s).Peek(ctx, rule, c.id); err != nil || r.Used != c.used {
					t.Errorf("%s after the batch: Used %d, %v; want %d", c.id, r.Used, err, c.used)
				}
			}
			// Sent again, it counts on the row the transaction created.
			again := rec.reqs[1:2]
			again[0].Checks[0].State = driver.State{}
			if err := s.AllowBatchForTest(ctx, again); err != nil || again[0].Checks[0].State.Used != 6 {
				t.Errorf("the call sent again: %+v, %v; want Used 6", again[0].Checks[0].State, err)
			}
		})
	}
}

// TestSecondBatchNeverSharesARow: with two batches in flight (the
// default), a call for a row that a batch in flight holds waits for it,
// while a call for another row goes beside it at once.
func TestSecondBatchNeverSharesARow(t *testing.T) {
	admin := testbackend.Postgres(t)
	s := pgstore.New(patientPool(t))
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: storetest.UseType(t, "beside"), Limit: 100, Window: countlimit.Rolling(time.Hour)}
	ctx := context.Background()
	b, first := stalled(t, admin, l, rule)
	second := goAllow(ctx, l, rule, "z") // its row is in flight: it waits
	waitQueued(t, s, 1)
	select {
	case o := <-goAllow(ctx, l, rule, "y"):
		if o.err != nil || o.res.Used != 1 {
			t.Fatalf("a call for another row, beside the stalled batch: %+v, %v", o.res, o.err)
		}
	case <-time.After(10 * time.Second):
		b.release(t)
		t.Fatal("a call for another row waits behind the stalled batch")
	}
	if n := s.QueuedForTest(); n != 1 {
		t.Errorf("%d calls wait, want the second z", n)
	}
	b.release(t)
	for i, ch := range []<-chan outcome{first, second} {
		if o := <-ch; o.err != nil || o.res.Used != int64(i+1) {
			t.Errorf("z call %d: %+v, %v; want Used %d, in arrival order", i+1, o.res, o.err, i+1)
		}
	}
}

// TestEveryKindGroupCommitIsExact sends 64 concurrent callers at one id
// with limit 100 for each kind countlimit_apply_batch takes (sliding,
// smooth, AllowAll of two rules): exactly 100 are allowed, each Used
// once, and the calls share statements.
func TestEveryKindGroupCommitIsExact(t *testing.T) {
	pool, tracer := tracedPool(t, testbackend.PoolConfig(t))
	// One instant for every call: a smooth key drains as a clock moves,
	// and callers' readings of one would reach the store out of order.
	at := time.Now()
	l := countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return at }))
	ctx := context.Background()
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "sliding"), Limit: 100, Window: countlimit.Sliding(time.Hour)}
	smooth := countlimit.Rule{UseType: storetest.UseType(t, "smooth"), Limit: 100, Window: countlimit.Smooth(time.Hour, 100)}
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "fixed"), Limit: 1000, Window: countlimit.Fixed(time.Hour)}
	const callers, each = 64, 4
	for name, allow := range map[string]func() (countlimit.Result, error){
		"sliding": func() (countlimit.Result, error) { return l.Allow(ctx, sliding, "hot") },
		"smooth":  func() (countlimit.Result, error) { return l.Allow(ctx, smooth, "hot") },
		"AllowAll": func() (countlimit.Result, error) {
			rs, err := l.AllowAll(ctx, "hot", fixed, sliding)
			if err != nil {
				return countlimit.Result{}, err
			}
			return rs[1], nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			// Each kind starts from nothing: the subtests run in the map's
			// order, and AllowAll counts on the sliding key too.
			for _, r := range []countlimit.Rule{sliding, smooth, fixed} {
				if err := l.Reset(ctx, r, "hot"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Peek(ctx, sliding, "hot"); err != nil {
				t.Fatal(err)
			}
			sending := tracer.n.Load()
			testbackend.AllAtOnce(t, callers, each, 100, func(int) (countlimit.Result, error) { return allow() })
			if n := tracer.n.Load() - sending; n >= callers*each {
				t.Errorf("%d calls sent %d statements: nothing was batched", callers*each, n)
			} else {
				t.Logf("%d calls in %d statements", callers*each, n)
			}
		})
	}
}

// TestEveryKindGroupCommitIsolatesIds holds one id's row in a transaction
// of its own: the calls of every kind on other ids, which countlimit_apply_batch
// takes, are all answered while it is held, and the held id's call is
// answered once it is let go, counted once.
func TestEveryKindGroupCommitIsolatesIds(t *testing.T) {
	pool := testbackend.Postgres(t)
	l := countlimit.New(pgstore.New(pool))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "sliding"), Limit: 10, Window: countlimit.Sliding(time.Hour)}
	smooth := countlimit.Rule{UseType: storetest.UseType(t, "smooth"), Limit: 10, Window: countlimit.Smooth(time.Hour, 10)}
	const ids = 32
	for i := range ids {
		for _, r := range []countlimit.Rule{sliding, smooth} {
			if _, err := l.Allow(ctx, r, fmt.Sprint("id", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := l.Allow(ctx, sliding, "held"); err != nil {
		t.Fatal(err)
	}
	b := lockRows(t, pool, sliding.UseType, "held")
	heldDone := make(chan error, 1)
	go func() {
		res, err := l.Allow(ctx, sliding, "held")
		if err == nil && res.Used != 2 {
			err = fmt.Errorf("Used %d, want 2", res.Used)
		}
		heldDone <- err
	}()
	var calls []func() error
	for i := range ids {
		id := fmt.Sprint("id", i)
		calls = append(calls,
			func() error { _, err := l.Allow(ctx, sliding, id); return err },
			func() error { _, err := l.Allow(ctx, smooth, id); return err },
			func() error { _, err := l.AllowAll(ctx, id, sliding, smooth); return err },
			func() error { _, err := l.Refund(ctx, sliding, id, 1); return err },
			func() error { _, err := l.Peek(ctx, smooth, id); return err },
		)
	}
	answeredWhileHeld(t, b, heldDone, calls)
}

// answeredWhileHeld runs calls at once and fails t unless every one
// returns nil while b holds its rows and the call on them, which sends its
// outcome to heldDone, is not answered; then it lets b go and holds that
// call's outcome to nil.
func answeredWhileHeld(t *testing.T, b *blocker, heldDone <-chan error, calls []func() error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(calls))
	for _, call := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- call() }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-heldDone:
		t.Fatalf("the call on the held row was answered while it was held: %v", err)
	default:
	}
	b.release(t)
	if err := <-heldDone; err != nil {
		t.Fatal(err)
	}
}
