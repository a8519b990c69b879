package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// opened is a store the command opened, and how to check and close it.
type opened struct {
	store countlimit.Store
	pg    *pgstore.Store // set for postgres:// stores
	ping  func(context.Context) error
	close func()
	desc  string // the URL, password hidden
}

// openStore opens the store a --store URL names and, for PostgreSQL with
// migrate, applies the migrations. It checks that the store answers (and,
// for PostgreSQL, holds countlimit's schema). The Redis client's own log
// lines go to log, or nowhere when it is nil.
func openStore(ctx context.Context, url string, migrate bool, log *slog.Logger) (*opened, error) {
	desc := redactURL(url)
	if migrate && !isPostgres(url) {
		return nil, usageErrorf("--migrate is for postgres:// stores, got %q", desc)
	}
	switch {
	case url == "" || url == "memory":
		s := memstore.New()
		return &opened{store: s, close: func() { s.Close() }, desc: "memory"}, nil
	case isPostgres(url):
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return nil, fmt.Errorf("--store %s: %w", desc, err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("--store %s: %w", desc, err)
		}
		if migrate {
			if err := pgstore.Migrate(ctx, pool); err != nil {
				pool.Close()
				return nil, err
			}
		}
		s := pgstore.New(pool)
		if err := s.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("--store %s: %w", desc, err)
		}
		return &opened{store: s, pg: s, ping: s.Ping, close: pool.Close, desc: desc}, nil
	case strings.HasPrefix(url, "redis://"), strings.HasPrefix(url, "rediss://"), strings.HasPrefix(url, "unix://"):
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("--store %s: %w", desc, err)
		}
		opts.ContextTimeoutEnabled = true
		redis.SetLogger(redisLog{log})
		c := redis.NewClient(opts)
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return nil, fmt.Errorf("--store %s: %w", desc, err)
		}
		ping := func(ctx context.Context) error { return c.Ping(ctx).Err() }
		return &opened{store: redisstore.New(c), ping: ping, close: func() { c.Close() }, desc: desc}, nil
	}
	return nil, usageErrorf("--store: want memory, postgres://... or redis://..., got %q", desc)
}

// redisLog sends go-redis's own log lines (dial retries and the like) to
// slog, so the service's stderr stays JSON.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	if l.log != nil {
		l.log.WarnContext(ctx, "redis client", "msg", fmt.Sprintf(format, v...))
	}
}
