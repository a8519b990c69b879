package testbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// SeedPurge writes, on a migrated schema, what a purge must delete and
// what it must keep, with use types that begin with prefix. Through a
// Limiter whose clock reads then: 30 counters of a one-minute window
// ("<prefix>minute/old-<i>"), a key holding two leases of a minute
// ("<prefix>slots/lease-old"), a penalty of 24 hours
// ("<prefix>blocked/keep") and a lifetime count ("<prefix>forever/keep").
// Through one whose clock reads now, an hour or more after then: a
// current rolling hour ("<prefix>hour/live") and a lease of an hour
// ("<prefix>slots/lease-live"). It returns how many rows and leases a
// purge at now deletes; PurgeKept lists what stays.
func SeedPurge(t testing.TB, pool *pgxpool.Pool, prefix string, then, now func() time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	old := countlimit.New(pgstore.New(pool), countlimit.WithClock(then))
	minute := countlimit.Rule{UseType: countlimit.UseType(prefix + "minute"), Limit: 1, Window: countlimit.Fixed(time.Minute)}
	for i := range 30 {
		if _, err := old.Allow(ctx, minute, fmt.Sprint("old-", i)); err != nil {
			t.Fatal(err)
		}
	}
	shortSlots := countlimit.Rule{UseType: countlimit.UseType(prefix + "slots"), Limit: 2, Window: countlimit.Concurrent(time.Minute)}
	for range 2 {
		if _, res, err := old.Acquire(ctx, shortSlots, "lease-old"); err != nil || !res.Allowed {
			t.Fatalf("Acquire(lease-old) = %+v, %v", res, err)
		}
	}
	blocked := countlimit.Rule{UseType: countlimit.UseType(prefix + "blocked"), Limit: 0, Window: countlimit.Fixed(time.Minute), Block: 24 * time.Hour}
	forever := countlimit.Rule{UseType: countlimit.UseType(prefix + "forever"), Limit: 1, Window: countlimit.Lifetime()}
	for _, r := range []countlimit.Rule{blocked, forever} {
		if _, err := old.Allow(ctx, r, "keep"); err != nil {
			t.Fatal(err)
		}
	}
	live := countlimit.New(pgstore.New(pool), countlimit.WithClock(now))
	hour := countlimit.Rule{UseType: countlimit.UseType(prefix + "hour"), Limit: 1, Window: countlimit.Rolling(time.Hour)}
	if _, err := live.Allow(ctx, hour, "live"); err != nil {
		t.Fatal(err)
	}
	longSlots := countlimit.Rule{UseType: countlimit.UseType(prefix + "slots"), Limit: 2, Window: countlimit.Concurrent(time.Hour)}
	if _, res, err := live.Acquire(ctx, longSlots, "lease-live"); err != nil || !res.Allowed {
		t.Fatalf("Acquire(lease-live) = %+v, %v", res, err)
	}
	return 30 + 2 + 1
}

// PurgeKept lists the rows and the leases' keys a purge leaves of what
// SeedPurge wrote with prefix, sorted as PurgeLeft lists them.
func PurgeKept(prefix string) (rows, leases []string) {
	return []string{prefix + "blocked/keep", prefix + "forever/keep", prefix + "hour/live", prefix + "slots/lease-live"},
		[]string{prefix + "slots/lease-live"}
}

// PurgeLeft lists the rows and the leases' keys left in pool's schema, as
// "use_type/unique_id", each sorted.
func PurgeLeft(t testing.TB, pool *pgxpool.Pool) (rows, leases []string) {
	t.Helper()
	list := func(query string) []string {
		r, err := pool.Query(context.Background(), query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	return list(`SELECT use_type || '/' || unique_id FROM count_limit ORDER BY 1`),
		list(`SELECT use_type || '/' || unique_id FROM count_limit_lease ORDER BY 1`)
}
