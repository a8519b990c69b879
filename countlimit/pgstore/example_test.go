package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/pgstore/pgstoretest"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// A Store on a pool: concurrent checks share commits (group commit). Size
// the pool for your concurrency with pool_max_conns in the URL. (This
// example needs a database at that URL, so it is compiled, not run;
// ExampleNew runs.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app?pool_max_conns=16")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // a Store has no Close of its own
	if err := pgstore.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	limiter := countlimit.New(pgstore.New(pool))
	pin := countlimit.Rule{UseType: "article.pin", Limit: 5, Window: countlimit.Calendar(countlimit.Month, time.UTC)}
	res, err := limiter.Allow(ctx, pin, "user-42")
	if err != nil {
		log.Fatal(err) // ErrUnavailable: the database failed
	}
	fmt.Println(res.Allowed, res.Remaining)
}

// A check inside the caller's transaction: the count commits with the
// business write, or neither does. (Compiled, not run: it needs a database
// with the application's articles table; TestTransactionCommitsOrRollsBackWithCaller runs
// the same steps.)
func Example_transaction() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pin := countlimit.Rule{UseType: "article.pin", Limit: 5, Window: countlimit.Calendar(countlimit.Month, time.UTC)}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := countlimit.New(pgstore.New(tx)).Allow(ctx, pin, "user-42")
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Println("pinned enough this month; try again in", res.RetryAfter)
		return
	}
	if _, err := tx.Exec(ctx, "UPDATE articles SET pinned = true WHERE id = $1", 7); err != nil {
		log.Fatal(err) // the deferred Rollback takes the count back too
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// Eight password changes at once for one user, through group commit, on a
// schema of its own (pgstoretest; in your code, the pool of the Example
// above): exactly the day's three are allowed, and the day ends at
// midnight in Shanghai.
func ExampleNew() {
	t := testenv.ExampleTB() // in a test of yours: its *testing.T
	ctx := context.Background()
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		log.Fatal(err)
	}
	now := func() time.Time { return time.Date(2026, 5, 11, 21, 0, 0, 0, shanghai) }
	limiter := countlimit.New(pgstore.New(pgstoretest.Pool(t)), countlimit.WithClock(now))
	rule := countlimit.Rule{UseType: "password.change", Limit: 3, Window: countlimit.Calendar(countlimit.Day, shanghai)}

	var allowed atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			res, err := limiter.Allow(ctx, rule, "user-42")
			if err != nil {
				log.Fatal(err)
			}
			if res.Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	res, err := limiter.Peek(ctx, rule, "user-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allowed:", allowed.Load(), "used:", res.Used, "next at:", res.ResetAt.In(shanghai).Format(time.DateTime))
	// Output: allowed: 3 used: 3 next at: 2026-05-12 00:00:00
}

// serveUntil stands for a service's own work in the examples.
func serveUntil(context.Context, *countlimit.Limiter) {}

// Purging beside the service: expired rows and leases go every five
// minutes, in batches beside live checks, until the service stops. Without
// a purge, count_limit keeps a row for every (use type, id) it ever saw.
// (Compiled, not run: it needs a database.)
func ExampleStore_PurgeEvery() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := pgstore.New(pool) // the Store your Limiter checks with
	go store.PurgeEvery(ctx, 5*time.Minute, pgstore.WithPurgeReport(func(p pgstore.PurgePass) {
		if p.Err != nil {
			log.Printf("purge: %v (trying again next time)", p.Err)
			return
		}
		log.Printf("purged %d expired rows in %v", p.Rows, p.Took)
	}))

	limiter := countlimit.New(store)
	serveUntil(ctx, limiter) // the service's own work
}
