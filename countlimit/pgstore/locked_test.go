package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/testkit/tally"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestLockedRowHoldsNoOtherIDHostage: another transaction holds one id's
// row for six seconds (holdFor), locked (as a check inside a caller's
// pgx.Tx does until it commits, on an id it has seen before) or inserted
// and not committed (the same check on a brand-new id), while 64 callers
// spread over 1 000 ids, with a store timeout and the circuit breaker on,
// as the service runs. The timeout (3 s) is generous for a loaded machine
// and half the time the lock is held, so a statement that waited for the
// lock would fail. (With 2 s and 1 s, an other id's call under the load of
// CI's container step, several packages and their servers on two cores,
// once waited out the 1 s in the pool's queue: with nothing else running
// the slowest took 130-420 ms, beside three CPU-bound loops 230-780 ms.)
// Group commit must not hold the other ids' calls behind that lock, nor may
// the locked id's own calls, in a batch or in a statement of their own (a
// sliding or smooth window's), take the pool's connections or count as
// store failures: no call for another id fails, the breaker stays closed,
// and the locked id's calls either wait for the lock or fail with
// ErrLocked.
func TestLockedRowHoldsNoOtherIDHostage(t *testing.T) {
	for _, tc := range hostageCases {
		t.Run(tc.name, func(t *testing.T) {
			holdOneID(t, testbackend.PostgresPool(t), tc, 64)
		})
	}
}

// TestLockWaitOutOfRangeHoldsNoIDHostage: the setting countlimit.lock_wait
// at 0, which PostgreSQL's lock_timeout reads as "wait for ever", or at a
// minute, on a pool of 4 connections, and one id's row held as in
// TestLockedRowHoldsNoOtherIDHostage: the other ids are still served, and
// the held id's calls still end in ErrLocked, not as store failures.
func TestLockWaitOutOfRangeHoldsNoIDHostage(t *testing.T) {
	for _, wait := range []string{"0", "1min"} {
		// The setting is how long a batch waits for a new id's insert,
		// and a statement of its own (a sliding window's) for any held
		// row; a batch skips a locked row without waiting.
		for _, tc := range []hostageCase{hostageCases[1], hostageCases[2]} {
			t.Run(fmt.Sprintf("lock_wait %s, %s", wait, tc.name), func(t *testing.T) {
				cfg := testbackend.PoolConfig(t)
				cfg.MaxConns = 4
				cfg.ConnConfig.RuntimeParams["countlimit.lock_wait"] = wait
				pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				// 16 callers, not 64: on 4 connections, one of them
				// often busy with the held id's statement (up to 100 ms
				// a send), 64 callers' statements queue for the other
				// three, and under -race on a loaded machine one call in
				// thousands waited out a 1 s timeout in the pool's
				// queue, not behind the lock (seen in CI).
				holdOneID(t, pool, tc, 16)
			})
		}
	}
}

type hostageCase struct {
	name   string
	window countlimit.Window
	limit  int64
	newID  bool // the held id's row is inserted by the holder, not locked
}

var hostageCases = []hostageCase{
	{"fixed window, a row locked", countlimit.Fixed(time.Hour), expose.MaxLimit, false},
	{"fixed window, a new id inserted", countlimit.Fixed(time.Hour), expose.MaxLimit, true},
	{"sliding window, a row locked", countlimit.Sliding(time.Hour), expose.MaxSlidingLimit, false},
	{"sliding window, a new id inserted", countlimit.Sliding(time.Hour), expose.MaxSlidingLimit, true},
	// A smooth check is a statement of its own (countlimit_apply), as a
	// sliding one is; 10^6 a second with a burst of 10^9 is never full.
	{"smooth window, a row locked", countlimit.Smooth(time.Second, 1_000_000_000), 1_000_000, false},
	{"smooth window, a new id inserted", countlimit.Smooth(time.Second, 1_000_000_000), 1_000_000, true},
}

// holdFor is how long holdOneID holds a row: twice its calls' timeout.
const holdFor = 6 * time.Second

// holdOneID holds one id's row in another transaction for holdFor
// while callers check 1 000 ids through a Store on pool (see
// TestLockedRowHoldsNoOtherIDHostage).
func holdOneID(t *testing.T, pool *pgxpool.Pool, tc hostageCase, callers int) {
	t.Helper()
	admin := testbackend.Postgres(t)
	var tl tally.Tally
	l := countlimit.New(pgstore.New(pool),
		countlimit.WithStoreTimeout(holdFor/2), countlimit.WithObserver(tl.Observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{OnChange: tl.BreakerChanged}))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "hostage"), Limit: tc.limit, Window: tc.window}
	ctx := context.Background()
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint("id-", i)
	}
	locked := ids[0]
	// Every row exists but, for a new id, the held one.
	seeded := ids
	if tc.newID {
		seeded = ids[1:]
	}
	if _, err := admin.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value)
		SELECT $1, id, 0, now(), now(), 0 FROM unnest($2::text[]) AS id`, string(rule.UseType), seeded); err != nil {
		t.Fatal(err)
	}
	var b *blocker
	if tc.newID {
		b = begin(t, admin)
		if res, err := countlimit.New(pgstore.New(b.tx)).Allow(ctx, rule, locked); err != nil || !res.Allowed {
			t.Fatalf("Allow of a new id in a transaction: %+v, %v", res, err)
		}
	} else {
		b = lockRows(t, admin, rule.UseType, locked)
	}
	released := make(chan struct{})
	time.AfterFunc(holdFor, func() { b.tx.Rollback(context.Background()); close(released) })
	defer func() { <-released }()

	var (
		others, lockedOK, lockedFailed atomic.Int64
		mu                             sync.Mutex
		otherErrs, lockedErrs          []error
		wg                             sync.WaitGroup
	)
	stop := time.Now().Add(holdFor + 500*time.Millisecond)
	for c := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for time.Now().Before(stop) {
				id := ids[1+rng.IntN(len(ids)-1)]
				if rng.IntN(50) == 0 {
					id = locked // often enough that many batches would hold it
				}
				res, err := l.Allow(ctx, rule, id)
				switch {
				case id == locked && err == nil:
					lockedOK.Add(1)
				case id == locked:
					lockedFailed.Add(1)
					if !errors.Is(err, countlimit.ErrLocked) || !errors.Is(err, countlimit.ErrUnavailable) {
						mu.Lock()
						lockedErrs = append(lockedErrs, err)
						mu.Unlock()
					}
				case err != nil || !res.Allowed:
					mu.Lock()
					otherErrs = append(otherErrs, err)
					mu.Unlock()
				default:
					others.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := len(lockedErrs); n > 0 {
		t.Errorf("%d calls of the locked id failed but not with ErrLocked (an ErrUnavailable); the first: %v", n, lockedErrs[0])
	}
	if n := len(otherErrs); n > 0 {
		t.Errorf("%d calls for the 999 ids nobody locked failed or were denied (%d succeeded); the first: %v", n, others.Load(), otherErrs[0])
	}
	st := tl.Counts()
	if st.BreakerOpenings != 0 || st.Failures != 0 || st.Timeouts != 0 || st.Locked != uint64(lockedFailed.Load()) {
		t.Errorf("counts = %+v; want no store failure or timeout, the breaker never opened, and %d calls Locked", st, lockedFailed.Load())
	}
	if lockedFailed.Load() == 0 {
		t.Errorf("no call of the locked id failed with ErrLocked; want its calls to wait out their timeout while the lock is held")
	}
	t.Logf("%d calls for other ids; the locked id: %d allowed (after the lock), %d waited out their timeout", others.Load(), lockedOK.Load(), lockedFailed.Load())
	if res, err := l.Allow(ctx, rule, locked); err != nil || !res.Allowed {
		t.Errorf("Allow of the formerly locked id = %+v, %v; want allowed", res, err)
	}
}

// TestBatchSkipsLockedRows sends batches that hold a row another
// transaction has locked, through both batch statements and as a batch of
// one: the locked row's calls come back busy with nothing applied, and the
// batch's other calls are counted without waiting for the lock.
func TestBatchSkipsLockedRows(t *testing.T) {
	for _, tc := range []struct {
		name string
		ids  []string
		busy []int // the calls that come back busy
		want map[string]int64
	}{
		{"alone", []string{"L"}, []int{0}, map[string]int64{"L": 1}},
		{"distinct keys", []string{"a", "L", "b"}, []int{1}, map[string]int64{"a": 2, "L": 1, "b": 1}},
		{"repeated keys", []string{"a", "L", "a", "L"}, []int{1, 3}, map[string]int64{"a": 3, "L": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := testbackend.Postgres(t)
			s := pgstore.New(testbackend.PostgresPool(t))
			rule := countlimit.Rule{UseType: storetest.UseType(t, "skip"), Limit: 10, Window: countlimit.Rolling(time.Hour)}
			ctx := context.Background()
			for _, id := range []string{"a", "L"} {
				if _, err := countlimit.New(s).Allow(ctx, rule, id); err != nil {
					t.Fatal(err)
				}
			}
			rec := &recorder{}
			for _, id := range tc.ids {
				if _, err := countlimit.New(rec).Allow(ctx, rule, id); err != nil {
					t.Fatal(err)
				}
			}
			b := lockRows(t, admin, rule.UseType, "L")
			err := s.AllowBatchForTest(ctx, rec.reqs)
			for _, i := range tc.busy {
				if want := fmt.Sprintf("call %d: %v", i, pgstore.ErrBusy); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("batch %v with L locked: %v; want %q", tc.ids, err, want)
				}
			}
			if err != nil && strings.Count(err.Error(), "\n")+1 != len(tc.busy) {
				t.Errorf("batch %v with L locked: %v; want only the calls of L busy", tc.ids, err)
			}
			b.release(t)
			for id, want := range tc.want {
				if r, err := countlimit.New(s).Peek(ctx, rule, id); err != nil || r.Used != want {
					t.Errorf("%s after the batch: Used %d, %v; want %d", id, r.Used, err, want)
				}
			}
		})
	}
}

// TestEveryCallOfALockedIDIsLocked: with an id's rows held locked by
// another transaction, every call on the pool that writes them (a group
// commit, an Allow of its own with group commit off, a sliding window,
// AllowAll, a smooth window's Allow and Refund, Refund, Reset, Acquire,
// Release) waits for the lock and, at
// its deadline, fails with ErrLocked: not a store failure, the breaker
// stays closed. Once the lock goes, each succeeds. Peek locks nothing.
func TestEveryCallOfALockedIDIsLocked(t *testing.T) {
	admin := testbackend.Postgres(t)
	pool := testbackend.PostgresPool(t)
	ctx := context.Background()
	ut := storetest.UseType(t, "every")
	fixed := countlimit.Rule{UseType: ut + ".fixed", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	sliding := countlimit.Rule{UseType: ut + ".sliding", Limit: 5, Window: countlimit.Sliding(time.Hour)}
	slots := countlimit.Rule{UseType: ut + ".slots", Limit: 5, Window: countlimit.Concurrent(time.Hour)}
	smooth := countlimit.Rule{UseType: ut + ".smooth", Limit: 5, Window: countlimit.Smooth(time.Hour, 5)}
	var batchedTally, aloneTally tally.Tally
	opts := func(tl *tally.Tally) []countlimit.Option {
		return []countlimit.Option{countlimit.WithStoreTimeout(750 * time.Millisecond), countlimit.WithObserver(tl.Observer()),
			countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{OnChange: tl.BreakerChanged})}
	}
	batched := countlimit.New(pgstore.New(pool), opts(&batchedTally)...)
	alone := countlimit.New(pgstore.New(pool, pgstore.WithMaxBatch(1)), opts(&aloneTally)...)
	const id = "L"
	var lease countlimit.Lease
	// The rows, by a Limiter of no store timeout: the 750 ms are for the
	// calls on locked rows, and a machine under load may take longer to
	// create a row (a deadline of the test's own still ends a hang). The
	// lease the test releases is batched's, taken once its row exists: a
	// lease is released by the Limiter that acquired it, which would wait
	// for the lock without a store timeout.
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	setupL := countlimit.New(pgstore.New(pool))
	setup := []func() error{
		func() error { _, err := setupL.Allow(setupCtx, fixed, id); return err },
		func() error { _, err := setupL.Allow(setupCtx, sliding, id); return err },
		func() error {
			l, _, err := setupL.Acquire(setupCtx, slots, id)
			if err != nil {
				return err
			}
			return l.Release(setupCtx)
		},
		func() error { var err error; lease, _, err = batched.Acquire(ctx, slots, id); return err },
		func() error { _, err := setupL.Allow(setupCtx, smooth, id); return err },
	}
	for _, f := range setup {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	calls := []struct {
		name string
		call func(l *countlimit.Limiter) error
	}{
		{"Allow, group commit", func(*countlimit.Limiter) error { _, err := batched.Allow(ctx, fixed, id); return err }},
		{"Allow, group commit off", func(*countlimit.Limiter) error { _, err := alone.Allow(ctx, fixed, id); return err }},
		{"Allow, sliding", func(l *countlimit.Limiter) error { _, err := l.Allow(ctx, sliding, id); return err }},
		{"AllowAll", func(l *countlimit.Limiter) error { _, err := l.AllowAll(ctx, id, fixed, sliding); return err }},
		{"Allow, smooth", func(l *countlimit.Limiter) error { _, err := l.Allow(ctx, smooth, id); return err }},
		{"Refund, smooth", func(l *countlimit.Limiter) error { _, err := l.Refund(ctx, smooth, id, 1); return err }},
		{"Refund", func(l *countlimit.Limiter) error { _, err := l.Refund(ctx, fixed, id, 1); return err }},
		{"Acquire", func(l *countlimit.Limiter) error { _, _, err := l.Acquire(ctx, slots, id); return err }},
		{"Release", func(*countlimit.Limiter) error { return lease.Release(ctx) }},
		{"Reset", func(l *countlimit.Limiter) error { return l.Reset(ctx, fixed, id) }},
	}
	b := begin(t, admin)
	if tag, err := b.tx.Exec(ctx, `SELECT FROM count_limit WHERE unique_id = $1 AND use_type = ANY ($2) FOR UPDATE`,
		id, []string{string(fixed.UseType), string(sliding.UseType), string(slots.UseType), string(smooth.UseType)}); err != nil || tag.RowsAffected() != 4 {
		t.Fatalf("locking the rows of %s: %v, %d rows", id, err, tag.RowsAffected())
	}
	if _, err := b.tx.Exec(ctx, `SELECT FROM count_limit_lease WHERE unique_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if err := c.call(batched); !errors.Is(err, countlimit.ErrLocked) {
			t.Errorf("%s of a locked id: %v; want ErrLocked", c.name, err)
		}
	}
	if _, err := batched.Peek(ctx, fixed, id); err != nil {
		t.Errorf("Peek of a locked id: %v; want nil (it locks nothing)", err)
	}
	for _, tl := range []*tally.Tally{&batchedTally, &aloneTally} {
		if st := tl.Counts(); st.Failures != 0 || st.BreakerOpenings != 0 || st.Locked == 0 {
			t.Errorf("counts = %+v; want calls Locked, no store failure, the breaker never opened", st)
		}
	}
	b.release(t)
	for _, c := range calls {
		if err := c.call(batched); err != nil {
			t.Errorf("%s once the lock is gone: %v", c.name, err)
		}
	}
}

// TestLockedTableIsAnOutage: another transaction holds count_limit itself
// locked (a DBA's LOCK TABLE, an ALTER TABLE): that is no held row but a
// stall of the whole store. Calls wait for the table as any statement
// would: a brief lock delays them, and one that outlasts their timeout
// fails them as store failures, for the circuit breaker and the fallback
// store, not as ErrLocked.
func TestLockedTableIsAnOutage(t *testing.T) {
	admin := testbackend.Postgres(t)
	var tl tally.Tally
	l := countlimit.New(pgstore.New(testbackend.PostgresPool(t)), countlimit.WithStoreTimeout(time.Second), countlimit.WithObserver(tl.Observer()))
	ctx := context.Background()
	lockTable := func() *blocker {
		b := begin(t, admin)
		if _, err := b.tx.Exec(ctx, `LOCK TABLE count_limit IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, w := range []countlimit.Window{countlimit.Fixed(time.Hour), countlimit.Sliding(time.Hour)} {
		rule := countlimit.Rule{UseType: storetest.UseType(t, "table"), Limit: 5, Window: w}
		b := lockTable()
		released := make(chan struct{})
		time.AfterFunc(200*time.Millisecond, func() { b.tx.Rollback(context.Background()); close(released) })
		if res, err := l.Allow(ctx, rule, "brief"); err != nil || !res.Allowed {
			t.Errorf("Allow (%v) with count_limit locked for 200 ms: %+v, %v; want it to wait, and count", w, res, err)
		}
		<-released
		b = lockTable()
		_, err := l.Allow(ctx, rule, "long")
		if !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, countlimit.ErrLocked) {
			t.Errorf("Allow (%v) with count_limit locked past the timeout: %v; want ErrUnavailable, not ErrLocked", w, err)
		}
		b.release(t)
		if _, err := l.Allow(ctx, rule, "long"); err != nil {
			t.Errorf("Allow (%v) once the table is free: %v", w, err)
		}
	}
	if st := tl.Counts(); st.Failures != 2 || st.Locked != 0 {
		t.Errorf("counts = %+v; want 2 failures, none Locked", st)
	}
}

// TestQueuedTableLockIsAnOutage: a lock on the whole table that is waited
// for, not yet granted, stalls the store as a granted one does. A report's
// SELECT holds count_limit in an open transaction; a DBA's LOCK TABLE (or
// ALTER TABLE) then queues behind it, and every statement that needs the
// table queues behind the DBA, whatever its id. So do a CREATE INDEX's
// SHARE lock queued behind a writer that has not committed, and locks on
// count_limit_lease, for the calls that write leases, queued or granted.
// Those calls are store failures (the breaker opens and the fallback
// answers), never ErrLocked, which is for a row another transaction holds.
// A lock on count_limit_lease leaves the counts alone.
func TestQueuedTableLockIsAnOutage(t *testing.T) {
	admin := testbackend.Postgres(t)
	pool := testbackend.PostgresPool(t)
	ctx := context.Background()
	const report = `SELECT count(*) FROM %s` // ACCESS SHARE, kept until the report's transaction ends
	for _, tc := range []struct {
		name         string
		table, mode  string
		behind       string // the transaction the lock queues behind; "" for a lock granted at once
		countsLocked bool   // Allow needs the table: count_limit, not count_limit_lease
	}{
		{"LOCK TABLE count_limit queued behind a report", "count_limit", "ACCESS EXCLUSIVE", fmt.Sprintf(report, "count_limit"), true},
		{"a SHARE lock of count_limit queued behind a writer", "count_limit", "SHARE", "LOCK TABLE count_limit IN ROW EXCLUSIVE MODE", true},
		{"LOCK TABLE count_limit_lease queued behind a report", "count_limit_lease", "ACCESS EXCLUSIVE", fmt.Sprintf(report, "count_limit_lease"), false},
		{"an EXCLUSIVE lock of count_limit_lease granted", "count_limit_lease", "EXCLUSIVE", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ut := storetest.UseType(t, "queued")
			fixed := countlimit.Rule{UseType: ut + ".fixed", Limit: 5, Window: countlimit.Fixed(time.Hour)}
			sliding := countlimit.Rule{UseType: ut + ".sliding", Limit: 5, Window: countlimit.Sliding(time.Hour)}
			slots := countlimit.Rule{UseType: ut + ".slots", Limit: 5, Window: countlimit.Concurrent(time.Hour)}
			const timeout = 750 * time.Millisecond
			var tl tally.Tally
			l := countlimit.New(pgstore.New(pool), countlimit.WithStoreTimeout(timeout), countlimit.WithObserver(tl.Observer()),
				countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 3, CoolDown: time.Hour, OnChange: tl.BreakerChanged}),
				countlimit.WithFallback(memstore.New(memstore.WithJanitorInterval(0))))
			release := testbackend.LockTable(t, admin, tc.table, tc.mode, tc.behind)

			// Checks of many ids at once, as a service makes them: group
			// commits and sliding windows.
			const calls = 16
			var (
				wg   sync.WaitGroup
				errs = make([]error, calls)
			)
			for i := range calls {
				wg.Go(func() {
					rule := fixed
					if i%2 == 1 {
						rule = sliding
					}
					res, err := l.Allow(ctx, rule, fmt.Sprint("id-", i))
					if err == nil && !res.Allowed {
						err = fmt.Errorf("denied: %+v", res)
					}
					errs[i] = err
				})
			}
			wg.Wait()
			var failed []error
			for _, err := range errs {
				if err != nil {
					failed = append(failed, err)
				}
			}
			if len(failed) > 0 {
				t.Errorf("%d of %d Allows of distinct ids with %s %s failed, want each allowed (by the fallback, when the store stalls); the first: %v",
					len(failed), calls, tc.table, tc.mode, failed[0])
			}
			st := tl.Counts()
			if tc.countsLocked {
				if st.Locked != 0 || st.Fallbacks != calls || st.Failures < 3 || st.Failures+st.Rejected != calls || st.BreakerOpenings != 1 {
					t.Errorf("counts after %d Allows = %+v; want none Locked, %d answered by the fallback, each a store failure or rejected by the breaker, which opened", calls, st, calls)
				}
			} else if st != (tally.Counts{}) {
				t.Errorf("counts after %d Allows = %+v; want none failed (count_limit is free)", calls, st)
			}

			t.Logf("counts after the Allows: %+v", st)

			// A lease is the store's alone: no fallback. (A Limiter of its
			// own: l's breaker may be open.)
			var leaseTally tally.Tally
			leases := countlimit.New(pgstore.New(pool), countlimit.WithStoreTimeout(timeout), countlimit.WithObserver(leaseTally.Observer()))
			_, _, err := leases.Acquire(ctx, slots, "lease")
			if !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, countlimit.ErrLocked) {
				t.Errorf("Acquire with %s %s: %v; want ErrUnavailable, not ErrLocked", tc.table, tc.mode, err)
			}
			if st := leaseTally.Counts(); st.Locked != 0 || st.Failures != 1 {
				t.Errorf("counts after Acquire = %+v; want a store failure, none Locked", st)
			}

			release()
			free := countlimit.New(pgstore.New(pool), countlimit.WithStoreTimeout(10*time.Second))
			if _, _, err := free.Acquire(ctx, slots, "lease"); err != nil {
				t.Errorf("Acquire once the table is free: %v", err)
			}
			if res, err := free.Allow(ctx, fixed, "id-0"); err != nil || !res.Allowed {
				t.Errorf("Allow once the table is free: %+v, %v", res, err)
			}
		})
	}
}

// TestLockWaitIsClamped: countlimit_lock_briefly takes countlimit.lock_wait
// within 1 ms to 100 ms, as docs/operations.md says; 0 (lock_timeout's
// "wait for ever") is 100 ms, and what lock_timeout would not read is the
// default, 2 ms, rather than an error in every statement of the pool.
func TestLockWaitIsClamped(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	for _, tc := range []struct{ setting, want string }{
		{"", "2ms"},
		{"10ms", "10ms"},
		{"5", "5ms"},
		{" 7 ms ", "7ms"},
		{"0.05s", "50ms"},
		{"100ms", "100ms"},
		{"1.5ms", "2ms"},
		{"0", "100ms"},
		{"101ms", "100ms"},
		{"1s", "100ms"},
		{"1min", "100ms"},
		{"999999999d", "100ms"},
		{"0.4ms", "1ms"},
		{"500us", "1ms"},
		{"abc", "2ms"},
		{"-5ms", "2ms"},
		{"10MS", "2ms"},
		{"1e3", "2ms"},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = tx.QueryRow(ctx, `SELECT set_config('countlimit.lock_wait', $1, true)`, tc.setting).Scan(new(string))
		if err == nil {
			err = tx.QueryRow(ctx, `SELECT countlimit_lock_briefly()`).Scan(new(string))
		}
		if err == nil {
			err = tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&got)
		}
		if err != nil || got != tc.want {
			t.Errorf("countlimit.lock_wait = %q: lock_timeout %q, %v; want %s", tc.setting, got, err, tc.want)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLockBrieflyIsPlannedOnce: countlimit_lock_briefly is PL/pgSQL,
// whose expressions a session plans once, not an SQL function, whose body
// a statement that is not prepared (behind a pooler) plans again at every
// call: about 115 µs of the server's CPU against 15 (docs/benchmarks.md).
func TestLockBrieflyIsPlannedOnce(t *testing.T) {
	pool := testbackend.Postgres(t)
	var lang string
	err := pool.QueryRow(context.Background(), `SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.oid = 'countlimit_lock_briefly()'::regprocedure`).Scan(&lang)
	if err != nil || lang != "plpgsql" {
		t.Errorf("countlimit_lock_briefly is in %q (%v), want plpgsql", lang, err)
	}
}

// TestHeldRowTakesAtMostHalfAConnection: with countlimit.lock_wait at its
// longest (100 ms), a call whose row another transaction holds is sent
// again after pauses no shorter than its sends waited for the lock, so
// over three seconds of a held row its sends hold a pool connection about
// half the time, never more (pauses of up to 32 ms after each 100 ms
// wait, as before, held one three quarters of the time: on a pool of 4,
// the other ids' calls queued for the rest, in CI's container step).
func TestHeldRowTakesAtMostHalfAConnection(t *testing.T) {
	cfg := testbackend.PoolConfig(t)
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["countlimit.lock_wait"] = "100ms"
	var (
		mu       sync.Mutex
		held     time.Duration
		acquired = map[*pgx.Conn]time.Time{}
	)
	cfg.PrepareConn = func(_ context.Context, c *pgx.Conn) (bool, error) {
		mu.Lock()
		acquired[c] = time.Now()
		mu.Unlock()
		return true, nil
	}
	cfg.AfterRelease = func(c *pgx.Conn) bool {
		mu.Lock()
		held += time.Since(acquired[c])
		delete(acquired, c)
		mu.Unlock()
		return true
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	admin := testbackend.Postgres(t)
	// A sliding window's check is a statement of its own on the pool.
	rule := countlimit.Rule{UseType: storetest.UseType(t, "held"), Limit: 100, Window: countlimit.Sliding(time.Hour)}
	if _, err := countlimit.New(pgstore.New(testbackend.PostgresPool(t))).Allow(ctx, rule, "held"); err != nil {
		t.Fatal(err)
	}
	b := lockRows(t, admin, rule.UseType, "held")
	defer b.tx.Rollback(ctx)

	l := countlimit.New(pgstore.New(pool), countlimit.WithStoreTimeout(3*time.Second))
	start := time.Now()
	_, err = l.Allow(ctx, rule, "held")
	elapsed := time.Since(start)
	if !errors.Is(err, countlimit.ErrLocked) {
		t.Fatalf("Allow of a held row for 3 s: %v, want ErrLocked", err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The first send and the turn's first go back to back (see waitLocks),
	// which a 3 s wait dilutes: about 0.53 in all.
	if share := float64(held) / float64(elapsed); share > 0.65 {
		t.Errorf("the held row's call held a connection %v of its %v (%.2f), want about half at most", held, elapsed, share)
	} else {
		t.Logf("the held row's call held a connection %v of its %v (%.2f)", held, elapsed, share)
	}
}
