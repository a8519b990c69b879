//go:build unix

package pgstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgbouncer"
)

// pooled is a schema of its own reached two ways: through a private
// pgbouncer, by pools on pgx's default settings, as an application behind
// a pooler opens them; and directly, for what a test looks at.
type pooled struct {
	bouncer *pgbouncer.Bouncer
	direct  *pgxpool.Pool
}

// behindPgBouncer creates a new, empty schema and starts a pgbouncer in
// front of it with settings (transaction pooling unless they say
// otherwise; see pgbouncer.Start).
func behindPgBouncer(t *testing.T, settings ...string) *pooled {
	t.Helper()
	url := testbackend.FreshSchemaURL(t)
	direct, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	return &pooled{bouncer: pgbouncer.Start(t, url, settings...), direct: direct}
}

// pool opens a pool through pgbouncer, on pgx's defaults, closed when t
// ends.
func (p *pooled) pool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), p.bouncer.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrated is behindPgBouncer with countlimit's migrations applied through
// pgbouncer, and a pool through it.
func migrated(t *testing.T, settings ...string) (*pooled, *pgxpool.Pool) {
	t.Helper()
	p := behindPgBouncer(t, settings...)
	pool := p.pool(t)
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("Migrate through pgbouncer: %v", err)
	}
	return p, pool
}

// The pooling modes of pgbouncer that pgstore works behind: transaction
// pooling, where a client's statements outside a transaction go to any of
// the server's connections, and session pooling.
var poolModes = []string{"transaction", "session"}

// TestBehindPgBouncer runs pgstore behind pgbouncer, with pools on pgx's
// default settings: the store's contract, group commit, checks in the
// caller's transaction, and 64 callers of every kind at once.
func TestBehindPgBouncer(t *testing.T) {
	for _, mode := range poolModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			setting := "pool_mode = " + mode
			if mode == "session" {
				// A server connection per client: the pools below and
				// their connections of the tests' transactions.
				setting += "\ndefault_pool_size = 40"
			}
			p, pool := migrated(t, setting)
			t.Run("conformance", func(t *testing.T) {
				next := testbackend.Alternate(pool, p.pool(t))
				storetest.Run(t, func(t *testing.T) driver.Store { return pgstore.New(next(t)) })
			})
			t.Run("contract", func(t *testing.T) {
				in := modeltest.Inspector{
					Read: func(ctx context.Context, ut, id string) (model.Key, error) { return readKey(ctx, p.direct, ut, id) },
					Seed: func(ctx context.Context, ut, id string, k model.Key) error { return seedKey(ctx, p.direct, ut, id, k) },
				}
				modeltest.RunContract(t, pgstore.New(pool), in)
			})
			t.Run("mixed callers", func(t *testing.T) { mixedCallers(t, pool) })
			t.Run("group commit", func(t *testing.T) {
				cfg, err := pgxpool.ParseConfig(p.bouncer.URL())
				if err != nil {
					t.Fatal(err)
				}
				groupCommitIsExact(t, cfg, p.direct)
				mixedTrafficNeverFails(t, pool, p.pool(t))
			})
			t.Run("caller's transaction", func(t *testing.T) {
				commitsOrRollsBackWithCaller(t, pool)
				deniedAcquireInCallersTx(t, pool)
			})
			t.Run("purge", func(t *testing.T) {
				q := behindPgBouncer(t, setting)
				purge(t, q.pool(t), q.direct)
			})
			t.Run("migrate", func(t *testing.T) {
				q := behindPgBouncer(t, setting)
				pool := q.pool(t)
				concurrentMigrate(t, pool)
				// Nothing is left locked: Migrate again, and again at once.
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				for range 2 {
					if err := pgstore.Migrate(ctx, pool); err != nil {
						t.Fatalf("Migrate after Migrate: %v", err)
					}
				}
				concurrentMigrate(t, q.pool(t))
			})
		})
	}
}

// mixedCallers sends 64 callers at once, 16 of each kind: Allow of a fixed
// window, AllowAll over two rules, Allow of a sliding window, and Acquire,
// each kind on a key of its own. Not one call fails, and every kind counts
// exactly: its limit allowed, with Used 1 to the limit each once.
func mixedCallers(t *testing.T, pool *pgxpool.Pool) {
	ctx := context.Background()
	l := countlimit.New(pgstore.New(pool))
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "mix.fixed"), Limit: 100, Window: countlimit.Fixed(time.Hour)}
	hourly := countlimit.Rule{UseType: storetest.UseType(t, "mix.hourly"), Limit: 60, Window: countlimit.Fixed(time.Hour)}
	daily := countlimit.Rule{UseType: storetest.UseType(t, "mix.daily"), Limit: 80, Window: countlimit.Rolling(24 * time.Hour)}
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "mix.sliding"), Limit: 50, Window: countlimit.Sliding(time.Hour)}
	slots := countlimit.Rule{UseType: storetest.UseType(t, "mix.slots"), Limit: 10, Window: countlimit.Concurrent(time.Hour)}
	const callers, each = 16, 8
	var (
		mu     sync.Mutex
		leases []countlimit.Lease
		wg     sync.WaitGroup
	)
	kinds := []struct {
		limit int64
		call  func() (countlimit.Result, error)
	}{
		{fixed.Limit, func() (countlimit.Result, error) { return l.Allow(ctx, fixed, "hot") }},
		{hourly.Limit, func() (countlimit.Result, error) {
			res, err := l.AllowAll(ctx, "hot", hourly, daily)
			if err != nil {
				return countlimit.Result{}, err
			}
			return res[0], nil
		}},
		{sliding.Limit, func() (countlimit.Result, error) { return l.Allow(ctx, sliding, "hot") }},
		{slots.Limit, func() (countlimit.Result, error) {
			lease, res, err := l.Acquire(ctx, slots, "hot")
			if err == nil && res.Allowed {
				mu.Lock()
				leases = append(leases, lease)
				mu.Unlock()
			}
			return res, err
		}},
	}
	for _, k := range kinds {
		wg.Go(func() {
			testbackend.AllAtOnce(t, callers, each, k.limit, func(int) (countlimit.Result, error) { return k.call() })
		})
	}
	wg.Wait()
	if r, err := l.Peek(ctx, daily, "hot"); err != nil || r.Used != hourly.Limit {
		t.Errorf("the second rule of AllowAll: Used %d, %v; want %d, as the first", r.Used, err, hourly.Limit)
	}
	// Every lease held extends and releases, and then no slot is taken.
	for _, lease := range leases {
		wg.Go(func() {
			if err := lease.Extend(ctx); err != nil {
				t.Errorf("Extend: %v", err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
	wg.Wait()
	if r, err := l.Peek(ctx, slots, "hot"); err != nil || r.Used != 0 {
		t.Errorf("slots after every lease was released: Used %d, %v; want 0", r.Used, err)
	}
	if t.Failed() {
		t.Logf("%d calls of 4 kinds by %d callers", 4*callers*each+2*len(leases), 4*callers)
	}
}

// TestStatementMode: a Store prepares its statements where its
// connections reach PostgreSQL itself, in a pool or a transaction, and
// nowhere a pooler stands between; a pool that sets a mode of its own
// keeps it.
func TestStatementMode(t *testing.T) {
	ctx := context.Background()
	url := testbackend.FreshSchemaURL(t)
	direct, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if err := pgstore.Migrate(ctx, direct); err != nil {
		t.Fatal(err)
	}
	// A server in a container is reached through a port mapping, which is
	// something between too: there is no direct connection to test.
	var port *int32 // NULL on a Unix socket
	if err := direct.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port); err != nil {
		t.Fatal(err)
	}
	mapped := port != nil && int(*port) != int(direct.Config().ConnConfig.Port)
	bouncer := pgbouncer.Start(t, url).URL()
	rule := countlimit.Rule{UseType: storetest.UseType(t, "mode"), Limit: 10, Window: countlimit.Fixed(time.Hour)}
	for _, tc := range []struct {
		name, url, query string
		want             string
	}{
		{"direct", url, "", "own"},
		{"pgbouncer", bouncer, "", "cache describe"},
		{"pgbouncer, no description cache", bouncer, "description_cache_capacity=0", "exec"},
		{"pgbouncer, the pool's own mode", bouncer, "default_query_exec_mode=simple_protocol", "own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "direct" && mapped {
				t.Skipf("the test server answers on port %d, not the %d dialed (a container's port mapping)", *port, direct.Config().ConnConfig.Port)
			}
			u := tc.url
			if tc.query != "" {
				u += "&" + tc.query
			}
			pool, err := pgxpool.New(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			s := pgstore.New(pool)
			if _, err := countlimit.New(s).Allow(ctx, rule, "p"); err != nil {
				t.Fatal(err)
			}
			if got := s.StatementModeForTest(); got != tc.want {
				t.Errorf("pool: statements in mode %q, want %q", got, tc.want)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			s = pgstore.New(tx)
			if _, err := countlimit.New(s).Allow(ctx, rule, "tx"); err != nil {
				t.Fatal(err)
			}
			if got := s.StatementModeForTest(); got != tc.want {
				t.Errorf("transaction: statements in mode %q, want %q", got, tc.want)
			}
		})
	}
}
