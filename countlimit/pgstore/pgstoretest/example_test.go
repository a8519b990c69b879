package pgstoretest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/pgstore/pgstoretest"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// A test of yours gets a schema of its own with countlimit's tables, on
// real PostgreSQL: here, that a user may change the password 3 times a day.
func ExamplePool() {
	t := testenv.ExampleTB() // in your test: its *testing.T
	ctx := context.Background()

	pool := pgstoretest.Pool(t)
	now := func() time.Time { return time.Date(2026, 5, 11, 21, 0, 0, 0, time.UTC) }
	limiter := countlimit.New(pgstore.New(pool), countlimit.WithClock(now))
	rule := countlimit.Rule{UseType: "password.change", Limit: 3, Window: countlimit.Calendar(countlimit.Day, time.UTC)}
	for i := range 4 {
		res, err := limiter.Allow(ctx, rule, "user-42")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("change %d: allowed=%v remaining=%d\n", i+1, res.Allowed, res.Remaining)
	}
	// Output:
	// change 1: allowed=true remaining=2
	// change 2: allowed=true remaining=1
	// change 3: allowed=true remaining=0
	// change 4: allowed=false remaining=0
}

// Code under test that opens its own connections gets a URL of a schema
// with countlimit's tables.
func ExampleURL() {
	t := testenv.ExampleTB() // in your test: its *testing.T
	ctx := context.Background()

	url := pgstoretest.URL(t)
	pool, err := pgxpool.New(ctx, url) // as the code under test would
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // before the schema goes
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM count_limit").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	fmt.Println("count_limit rows:", rows)
	// Output: count_limit rows: 0
}
