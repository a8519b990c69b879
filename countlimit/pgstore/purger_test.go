package pgstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// purgeT0 is after the tests' own time, so that only a purger that takes
// its clock from WithPurgeClock (export_purge_test.go) finds anything expired.
var purgeT0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// seedExpired writes testbackend.SeedPurge's rows (use types "purge.*"):
// what must go at purgeT0, what must stay an hour later. It leaves clock
// an hour after purgeT0 and returns how many rows and leases a purge then
// deletes.
func seedExpired(t *testing.T, pool *pgxpool.Pool, clock *storetest.Clock) int64 {
	t.Helper()
	clock.Set(purgeT0.Add(time.Hour))
	return testbackend.SeedPurge(t, pool, "purge.",
		func() time.Time { return purgeT0 }, func() time.Time { return purgeT0.Add(time.Hour) })
}

var keptRows, keptLeases = testbackend.PurgeKept("purge.")

// passes collects what PurgeEvery reports, for a test to read while the
// purger runs.
type passes struct {
	mu   sync.Mutex
	list []pgstore.PurgePass
}

func (p *passes) add(pass pgstore.PurgePass) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = append(p.list, pass)
}

func (p *passes) get() []pgstore.PurgePass {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.list)
}

// eventually polls cond until it holds or a generous deadline passes: the
// machine may be loaded, so only the outcome is asserted, never how soon.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReturn waits for PurgeEvery's result, guarding against a purger that
// never stops.
func waitReturn(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("PurgeEvery did not return after its context ended")
		return nil
	}
}

// TestPurgeEvery: the purger deletes expired rows and leases in batches,
// pass after pass, keeps what is live, reports every pass, and returns its
// context's error once the context ends.
func TestPurgeEvery(t *testing.T) {
	t.Parallel()
	pool := testbackend.FreshSchema(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(purgeT0)
	want := seedExpired(t, pool, clock)
	store := pgstore.New(pool)

	var got passes
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- store.PurgeEvery(runCtx, 20*time.Millisecond,
			pgstore.WithPurgeBatchSize(7), pgstore.WithPurgeClock(clock.Now), pgstore.WithPurgeReport(got.add))
	}()
	eventually(t, "the expired rows and leases to go", func() bool {
		rows, leases := testbackend.PurgeLeft(t, pool)
		return slices.Equal(rows, keptRows) && slices.Equal(leases, keptLeases)
	})
	var total int64
	eventually(t, "the passes that purged them to be reported, and a pass after them", func() bool {
		list := got.get()
		total = 0
		for _, p := range list {
			total += p.Rows
		}
		return total >= want && len(list) >= 2 && list[len(list)-1].Rows == 0
	})
	cancel()
	if err := waitReturn(t, done); !errors.Is(err, context.Canceled) {
		t.Errorf("PurgeEvery after cancel = %v, want context.Canceled", err)
	}
	if total != want {
		t.Errorf("passes reported %d rows and leases deleted, want %d", total, want)
	}
	list := got.get()
	several := false
	for i, p := range list {
		if p.Err != nil || !p.Now.Equal(clock.Now()) || p.Batches < 1 || p.Took <= 0 {
			t.Errorf("pass %d = %+v; want no error, Now %v, at least one batch and a duration", i, p, clock.Now())
		}
		several = several || p.Batches > 1
	}
	if !several {
		t.Errorf("no pass ran more than one batch of 7 over %d rows and leases: %+v", want, list)
	}
	if rows, leases := testbackend.PurgeLeft(t, pool); !slices.Equal(rows, keptRows) || !slices.Equal(leases, keptLeases) {
		t.Errorf("left after purging: rows %v, leases %v; want %v and %v", rows, leases, keptRows, keptLeases)
	}
}

// TestPurgeEveryStops: PurgeEvery returns its context's error when the
// context ends between passes, during a pass (which is then not
// reported), or at its deadline.
func TestPurgeEveryStops(t *testing.T) {
	t.Parallel()
	// A schema of its own: these purgers run on the real clock, and the
	// shared schema holds other tests' rows written with stubbed clocks.
	pool := testbackend.FreshSchema(t)
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(pool)
	t.Run("between passes", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		first := make(chan pgstore.PurgePass, 1)
		done := make(chan error, 1)
		go func() {
			done <- store.PurgeEvery(ctx, time.Hour, pgstore.WithPurgeReport(func(p pgstore.PurgePass) { first <- p }))
		}()
		select {
		case p := <-first:
			if p.Err != nil {
				t.Errorf("first pass: %v", p.Err)
			}
		case err := <-done:
			t.Fatalf("PurgeEvery returned %v before its first pass", err)
		case <-time.After(30 * time.Second):
			t.Fatal("no first pass")
		}
		cancel()
		if err := waitReturn(t, done); !errors.Is(err, context.Canceled) {
			t.Errorf("PurgeEvery = %v, want context.Canceled", err)
		}
	})
	t.Run("during a pass", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var got passes
		// The clock is read as a pass begins: the pass's statements then
		// run under a context that has ended.
		now := func() time.Time { cancel(); return time.Now() }
		done := make(chan error, 1)
		go func() {
			done <- store.PurgeEvery(ctx, time.Hour, pgstore.WithPurgeClock(now), pgstore.WithPurgeReport(got.add))
		}()
		if err := waitReturn(t, done); !errors.Is(err, context.Canceled) {
			t.Errorf("PurgeEvery = %v, want context.Canceled", err)
		}
		if list := got.get(); len(list) != 0 {
			t.Errorf("a pass cut short by the context was reported: %+v", list)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- store.PurgeEvery(ctx, time.Hour) }()
		if err := waitReturn(t, done); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("PurgeEvery = %v, want context.DeadlineExceeded", err)
		}
	})
}

// TestPurgeEveryOutlivesFailures: a pass that fails is reported with its
// error, and the purger goes on; once the database can purge again, the
// next pass does.
func TestPurgeEveryOutlivesFailures(t *testing.T) {
	t.Parallel()
	pool := testbackend.FreshSchema(t) // no schema yet: every pass fails
	clock := storetest.NewClock(purgeT0.Add(time.Hour))
	var got passes
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- pgstore.New(pool).PurgeEvery(ctx, 20*time.Millisecond, pgstore.WithPurgeClock(clock.Now), pgstore.WithPurgeReport(got.add))
	}()
	eventually(t, "two failed passes", func() bool { return len(got.get()) >= 2 })
	for i, p := range got.get() {
		if !errors.Is(p.Err, countlimit.ErrUnavailable) || p.Rows != 0 {
			t.Errorf("pass %d on a database without the schema = %+v, want ErrUnavailable", i, p)
		}
	}
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	want := seedExpired(t, pool, clock)
	eventually(t, "a pass to purge once the schema is there", func() bool {
		var total int64
		for _, p := range got.get() {
			total += p.Rows
		}
		return total >= want
	})
	select {
	case err := <-done:
		t.Fatalf("PurgeEvery returned %v while its context was live", err)
	default:
	}
	cancel()
	if err := waitReturn(t, done); !errors.Is(err, context.Canceled) {
		t.Errorf("PurgeEvery = %v, want context.Canceled", err)
	}
}

// TestPurgeEveryInvalid: a bad interval or batch size is ErrInvalid at
// once, before any pass.
func TestPurgeEveryInvalid(t *testing.T) {
	t.Parallel()
	store := pgstore.New(testbackend.FreshSchema(t))
	for _, tc := range []struct {
		name     string
		interval time.Duration
		opts     []pgstore.PurgeOption
	}{
		{"interval 0", 0, nil},
		{"interval -1s", -time.Second, nil},
		{"batch 0", time.Minute, []pgstore.PurgeOption{pgstore.WithPurgeBatchSize(0)}},
		{"batch too big", time.Minute, []pgstore.PurgeOption{pgstore.WithPurgeBatchSize(pgstore.MaxBatchSize + 1)}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := store.PurgeEvery(ctx, tc.interval, tc.opts...)
		cancel()
		if !errors.Is(err, countlimit.ErrInvalid) {
			t.Errorf("%s: PurgeEvery = %v, want ErrInvalid", tc.name, err)
		}
	}
}
