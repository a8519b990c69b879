package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/service/bench"
	"github.com/countlimit/countlimit/internal/service/clikit"
	"github.com/countlimit/countlimit/internal/store/pgmigrate"
	"github.com/countlimit/countlimit/internal/store/redisurl"
)

// opened is a store the command opened, and how to check and close it.
type opened struct {
	store driver.Store
	pg    *pgstore.Store // set for postgres:// stores
	pool  *pgxpool.Pool  // set for postgres:// stores
	redis *redis.Client  // set for redis:// stores
	ping  func(context.Context) error
	close func()
	desc  string // the URL, password hidden
	// behind, for serve, says which migrations a PostgreSQL schema
	// lacked at start; nil when it had them all. Its text names no
	// address.
	behind error
	// eviction and persistence report a Redis store's maxmemory-policy
	// and persistence (redisstore's CheckEviction and CheckPersistence);
	// nil for other stores (see storeChecks).
	eviction, persistence func(context.Context) error
}

// openStore opens the store a --store URL names and, for PostgreSQL with
// migrate, applies the migrations. It checks that the store answers (and,
// for PostgreSQL, holds countlimit's schema). The Redis client's own log
// lines go to log, or nowhere when it is nil.
func openStore(ctx context.Context, url string, migrate bool, log *slog.Logger) (*opened, error) {
	return openStoreMaybeDown(ctx, url, migrate, log, nil)
}

// openStoreMaybeDown is openStore for serve: when down is not nil and the
// store does not answer (see unreachable), it sets *down to the error and
// returns the store unchecked and unmigrated instead of failing; and a
// PostgreSQL store that answers but lacks migrations is returned with
// behind set, instead of failing.
func openStoreMaybeDown(ctx context.Context, url string, migrate bool, log *slog.Logger, down *error) (*opened, error) {
	desc := clikit.RedactURL(url)
	tolerated := func(err error) bool {
		if down == nil || !unreachable(err) {
			return false
		}
		*down = fmt.Errorf("--store %s: %w", desc, err)
		return true
	}
	if migrate && !clikit.IsPostgres(url) {
		return nil, clikit.UsageErrorf("--migrate is for postgres:// stores, got %q", desc)
	}
	switch {
	case url == "" || url == "memory":
		s := memstore.New()
		return &opened{store: s, close: func() { s.Close() }, desc: "memory"}, nil
	case clikit.IsPostgres(url):
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return nil, clikit.BadStoreURL(url, err)
		}
		if err := pool.Ping(ctx); err != nil {
			if tolerated(err) {
				s := pgstore.New(pool)
				return &opened{store: s, pg: s, pool: pool, ping: s.Ping, close: pool.Close, desc: desc}, nil
			}
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
		o := &opened{store: s, pg: s, pool: pool, ping: s.Ping, close: pool.Close, desc: desc}
		if err := s.Ping(ctx); err != nil {
			if down != nil {
				if o.behind = o.schemaReady(ctx); o.behind != nil && !errors.Is(o.behind, countlimit.ErrUnavailable) {
					return o, nil
				}
			}
			pool.Close()
			return nil, fmt.Errorf("--store %s: %w", desc, err)
		}
		return o, nil
	case strings.HasPrefix(url, "redis://"), strings.HasPrefix(url, "rediss://"), strings.HasPrefix(url, "unix://"):
		clientURL, opts, err := redisStoreOptions(url)
		if err != nil {
			return nil, clikit.BadStoreURL(url, err)
		}
		c, err := redisurl.Open(clientURL, failFast)
		if err != nil {
			return nil, clikit.BadStoreURL(url, err)
		}
		redisLogOnce.Do(func() { redis.SetLogger(&redisLog{}) })
		redisLogTo.Store(log)
		if err := c.Ping(ctx).Err(); err != nil && !tolerated(err) {
			c.Close()
			return nil, fmt.Errorf("--store %s: %w", desc, err)
		}
		ping := func(ctx context.Context) error { return c.Ping(ctx).Err() }
		s := redisstore.New(c, opts...)
		return &opened{store: s, redis: c, ping: ping, eviction: s.CheckEviction, persistence: s.CheckPersistence, close: func() { c.Close() }, desc: desc}, nil
	}
	return nil, clikit.UsageErrorf("--store: want memory, postgres://... or redis://..., got %q", desc)
}

// schemaReady is server.Config.Schema for a PostgreSQL store: nil when
// its schema is at this release's latest migration; else, when the
// version table says which migrations it lacks, an error that names them
// and what to run; else the store's error, which is
// countlimit.ErrUnavailable.
func (o *opened) schemaReady(ctx context.Context) error {
	err := o.pg.Ping(ctx)
	if err == nil {
		return nil
	}
	pending, perr := pgmigrate.Pending(ctx, o.pool)
	switch {
	case perr != nil:
		return driver.Unavailable(perr)
	case len(pending) == 0:
		return err // the schema is elsewhere, or it was migrated meanwhile
	}
	lacks := "lacks migration " + pending[0]
	if len(pending) > 1 {
		lacks = fmt.Sprintf("lacks %d migrations, %s", len(pending), strings.Join(pending, ", "))
	}
	return fmt.Errorf(`countlimit's schema here %s: run "countlimit migrate up" (or serve --migrate)`, lacks)
}

// conns returns how many connections the store may hold open at most,
// each a file of the process; 0 for memory.
func (o *opened) conns() int {
	switch {
	case o.pool != nil:
		return int(o.pool.Config().MaxConns)
	case o.redis != nil:
		opt := o.redis.Options()
		pipeline := opt.PipelinePoolSize
		if pipeline == 0 {
			pipeline = redis.DefaultPipelinePoolSize
		}
		return max(opt.PoolSize, opt.MaxActiveConns) + max(pipeline, 0)
	}
	return 0
}

// redisStoreOptions takes the URL's own parameters for redisstore out of a
// Redis URL, which go-redis would refuse, and returns the rest of it and
// the options they ask for: script_per_call=true gives
// redisstore.WithScriptPerCall (for a proxy that shards by key).
func redisStoreOptions(rawURL string) (string, []redisstore.Option, error) {
	u, err := neturl.Parse(rawURL)
	if err != nil {
		return "", nil, err
	}
	q := u.Query()
	if !q.Has("script_per_call") {
		return rawURL, nil, nil
	}
	v := q.Get("script_per_call")
	perCall, err := strconv.ParseBool(v)
	if err != nil {
		return "", nil, fmt.Errorf("script_per_call=%q: want true or false", v)
	}
	q.Del("script_per_call")
	u.RawQuery = q.Encode()
	var opts []redisstore.Option
	if perCall {
		opts = append(opts, redisstore.WithScriptPerCall())
	}
	return u.String(), opts, nil
}

// failFast sets what the URL leaves unset so that a Redis store that is
// down fails a call at once: go-redis's defaults dial 5 times per attempt
// and retry 3 times, so each failed call would wait out every dial and
// backoff, and log every attempt. A retry
// stays: redisstore answers a repeated call with its first reply (see its
// package doc), so a connection dropped mid-call costs no error and no
// double count. The URL's max_retries and dial_timeout win.
func failFast(o *redis.Options) {
	if o.MaxRetries == 0 {
		o.MaxRetries = 1
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = time.Second
	}
	o.DialerRetries = 1
}

// go-redis has one logger per process: it is set once, since setting it
// per client would race with the clients already running. redisLogTo is
// where its lines go: the logger of the latest openStore, or nowhere.
var (
	redisLogOnce sync.Once
	redisLogTo   atomic.Pointer[slog.Logger]
)

// redisLog sends go-redis's own log lines (failed dials and the like) to
// slog, so the service's stderr stays JSON. It drops a line that repeats
// the last one within a second: a call retried against a store that is
// down fails to dial twice, and an outage must not flood the log.
type redisLog struct {
	mu   sync.Mutex
	last string
	at   time.Time
}

func (l *redisLog) Printf(ctx context.Context, format string, v ...any) {
	log := redisLogTo.Load()
	if log == nil {
		return
	}
	msg := fmt.Sprintf(format, v...)
	now := time.Now()
	l.mu.Lock()
	repeat := msg == l.last && now.Sub(l.at) < time.Second
	if !repeat {
		l.last, l.at = msg, now
	}
	l.mu.Unlock()
	if !repeat {
		log.WarnContext(ctx, msg, "component", "go-redis")
	}
}

// unreachable reports whether err, from a store's first ping, says that the
// store did not answer, or is not ready yet (starting, loading, shutting
// down), rather than that it answered no (bad password, no such database).
func unreachable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// 08: connection exception; 53: insufficient resources (too many
		// connections); 57: operator intervention (starting up, shutting down).
		class := pgErr.Code
		if len(class) > 2 {
			class = class[:2]
		}
		return class == "08" || class == "53" || class == "57"
	}
	var rErr redis.Error
	if errors.As(err, &rErr) {
		for _, p := range []string{"LOADING ", "MASTERDOWN ", "BUSY ", "TRYAGAIN ", "CLUSTERDOWN "} {
			if strings.HasPrefix(rErr.Error(), p) {
				return true
			}
		}
		return false
	}
	return true
}

// openBenchStore is bench.Env.Open: the store as openStore opens it
// without migrating.
func openBenchStore(ctx context.Context, url string) (*bench.Store, error) {
	st, err := openStore(ctx, url, false, nil)
	if err != nil {
		return nil, err
	}
	return &bench.Store{Store: st.store, Pool: st.pool, Redis: st.redis, Desc: st.desc, Close: st.close}, nil
}
