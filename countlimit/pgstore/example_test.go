package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// A Store on a pool: concurrent checks share commits (group commit). Size
// the pool for your concurrency with pool_max_conns in the URL.
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
// business write, or neither does.
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
