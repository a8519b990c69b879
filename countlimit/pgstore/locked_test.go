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

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testbackend"
)

// TestLockedRowHoldsNoOtherIDHostage: another transaction holds one id's
// row locked for two seconds (as a check inside a caller's pgx.Tx does
// until it commits) while 64 callers spread over 1 000 ids, with a store
// timeout and the circuit breaker on, as the service runs. The timeout
// (500 ms) is generous for a loaded machine and four times shorter than
// the lock, so a batch that waited for the lock would fail every call in it. Group commit must not
// hold the other ids' calls behind that lock: none of them fails, the
// breaker stays closed, and the locked id's calls, which may wait out their
// timeout, are not store failures.
func TestLockedRowHoldsNoOtherIDHostage(t *testing.T) {
	admin := testbackend.Postgres(t)
	l := countlimit.New(pgstore.New(testbackend.PostgresPool(t)),
		countlimit.WithStoreTimeout(500*time.Millisecond),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{}))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "hostage"), Limit: countlimit.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	ctx := context.Background()
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint("id-", i)
	}
	// Every row exists, the locked one too.
	if _, err := admin.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value)
		SELECT $1, id, 0, now(), now(), 0 FROM unnest($2::text[]) AS id`, string(rule.UseType), ids); err != nil {
		t.Fatal(err)
	}
	locked := ids[0]
	b := lockRows(t, admin, rule.UseType, locked)
	held := time.AfterFunc(2*time.Second, func() { b.tx.Rollback(context.Background()) })
	defer held.Stop()

	var (
		others, lockedOK, lockedFailed atomic.Int64
		mu                             sync.Mutex
		otherErrs                      []error
		wg                             sync.WaitGroup
	)
	stop := time.Now().Add(2500 * time.Millisecond)
	for c := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for time.Now().Before(stop) {
				id := ids[rng.IntN(len(ids))]
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
						t.Errorf("Allow of the locked id: %v, want ErrLocked (an ErrUnavailable)", err)
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
	if n := len(otherErrs); n > 0 {
		t.Errorf("%d calls for the 999 ids nobody locked failed or were denied (%d succeeded); the first: %v", n, others.Load(), otherErrs[0])
	}
	st := l.Stats()
	if st.BreakerOpenings != 0 || st.Failures != 0 || st.Timeouts != 0 || st.Locked != uint64(lockedFailed.Load()) {
		t.Errorf("Stats = %+v; want no store failure or timeout, the breaker never opened, and %d calls Locked", st, lockedFailed.Load())
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
