// Package bench is "countlimit bench": concurrent calls against a store,
// their throughput and latency as a table, --json, --csv and an SVG plot,
// and (--baseline) Allow beside a hand-written PostgreSQL upsert. The
// command (internal/service/cli) calls Run, and prints its errors and help
// as it does its own commands'; what both use is internal/service/clikit.
package bench

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// Env is what Run takes from the command it runs under.
type Env struct {
	// Open opens the store a plain bench's --store URL names, checked
	// that it answers (--baseline opens its own pools).
	Open func(ctx context.Context, url string) (*Store, error)
}

// Store is a store a bench runs against, as Env.Open opened it.
type Store struct {
	Store driver.Store
	Pool  *pgxpool.Pool // set for postgres:// stores
	Redis *redis.Client // set for redis:// stores
	Desc  string        // the URL, password hidden
	Close func()
}
