//go:build fault

package faulttest

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/store/gather"
	optally "github.com/countlimit/countlimit/internal/testkit/tally"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgcluster"
)

// appName marks the pool's connections, so a fault kills those and no others.
const appName = "countlimit-fault"

func TestPostgres(t *testing.T) {
	srv := startPostgres(t)
	base := runtime.NumGoroutine()
	ctx := context.Background()

	pool, err := pgxpool.New(ctx, srv.url(appName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // when the test stops early; Close is idempotent
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	tg := &target{
		store:   "postgres",
		limiter: countlimit.New(pgstore.New(pool)),
		counts:  srv.counts,
		// A call that left the group commit's queue before its batch was
		// sent was never counted; any other failure may have committed.
		maybeCounted: func(err error) bool { return !errors.Is(err, gather.ErrLeft) },
	}
	faults := []fault{
		baseline,
		{name: "kill", keepsData: true, inject: func(t *testing.T, p *phase) {
			for range 5 {
				srv.terminate(t)
				p.back()
				time.Sleep(200 * time.Millisecond)
			}
		}},
		{name: "stall", keepsData: true, inject: func(t *testing.T, p *phase) {
			srv.lockTable(t, 2*time.Second)
			p.back()
		}},
		{name: "restart", keepsData: true, inject: func(t *testing.T, p *phase) {
			srv.ctl(t, "restart", "-m", "fast")
			p.back()
		}},
		{name: "outage10s", keepsData: true, inject: func(t *testing.T, p *phase) {
			srv.ctl(t, "stop", "-m", "fast")
			time.Sleep(10 * time.Second)
			srv.ctl(t, "start")
			p.back()
		}},
	}
	for _, f := range faults {
		run(t, tg, f)
	}

	// One id's row held locked by another transaction for a second, under
	// a Limiter set as the service sets one (a store timeout, the circuit
	// breaker): only that id's calls wait, and none is a store failure.
	// The Limiter's Observer and breaker tell a tally what the options did.
	guarded := func(tl *optally.Tally) *target {
		g := *tg
		g.limiter = countlimit.New(pgstore.New(pool), countlimit.WithStoreTimeout(200*time.Millisecond),
			countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{OnChange: tl.BreakerChanged}),
			countlimit.WithObserver(tl.Observer()))
		return &g
	}
	locked := new(optally.Tally)
	run(t, guarded(locked), fault{name: "rowlock", keepsData: true, noErrors: true, held: heldName(0, 0), inject: func(t *testing.T, p *phase) {
		srv.lockRow(t, acctRule.UseType, p.heldID, time.Second)
		if st := locked.Counts(); st.BreakerOpenings != 0 || st.Failures != 0 {
			t.Errorf("with one row locked: %+v; want no store failure, the breaker never opened", st)
		}
	}})
	// The same with a new id: another transaction checks it first, which
	// inserts its row, and holds that uncommitted for a second (then rolls
	// back); its caller calls it only from then on.
	inserting := new(optally.Tally)
	run(t, guarded(inserting), fault{name: "rowinsert", keepsData: true, noErrors: true, held: heldName(0, 0), heldNew: true, inject: func(t *testing.T, p *phase) {
		srv.inserting(t, p, acctRule, time.Second)
		if st := inserting.Counts(); st.BreakerOpenings != 0 || st.Failures != 0 {
			t.Errorf("with one new row held: %+v; want no store failure, the breaker never opened", st)
		}
	}})
	pool.Close()
	checkGoroutines(t, base)
}

// pgServer is a PostgreSQL cluster of the test's own (pgcluster), durable
// as a production server is.
type pgServer struct{ *pgcluster.Cluster }

// startPostgres creates and starts a cluster, stopped and removed when t
// ends. It skips t (fails it when backends are required) without the binaries.
func startPostgres(t *testing.T) *pgServer {
	t.Helper()
	bin, err := pgcluster.Bin()
	if err != nil {
		testbackend.Unavailable(t, "PostgreSQL server binaries", err)
	}
	return &pgServer{pgcluster.Start(t, bin, "fsync = on\nsynchronous_commit = on\nmax_connections = 50")}
}

func (s *pgServer) url(app string) string { return s.URL("postgres") + "&application_name=" + app }

// ctl runs pg_ctl start, stop or restart and waits for it to finish.
func (s *pgServer) ctl(t *testing.T, action string, args ...string) { s.Ctl(t, action, args...) }

// admin opens a connection of its own, outside the pool under test.
func (s *pgServer) admin(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, s.url(appName+"-admin"))
}

// terminate kills every connection of the pool under test.
func (s *pgServer) terminate(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := s.admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, appName); err != nil {
		t.Fatal(err)
	}
}

// lockTable holds count_limit in ACCESS EXCLUSIVE mode for d: every check
// stalls behind it.
func (s *pgServer) lockTable(t *testing.T, d time.Duration) {
	t.Helper()
	s.holding(t, d, `LOCK TABLE count_limit IN ACCESS EXCLUSIVE MODE`)
}

// lockRow holds the row of (ut, id) locked FOR UPDATE for d, as a check
// inside a caller's transaction does until it commits.
func (s *pgServer) lockRow(t *testing.T, ut countlimit.UseType, id string, d time.Duration) {
	t.Helper()
	if n := s.holding(t, d, `SELECT FROM count_limit WHERE use_type = $1 AND unique_id = $2 FOR UPDATE`, string(ut), id); n != 1 {
		t.Fatalf("locking the row of (%s, %s): %d rows", ut, id, n)
	}
}

// inserting checks p's held id, which has no row yet, with r inside a
// transaction of its own (which inserts the row), lets p's callers call it
// while it holds the row uncommitted for d, and rolls it back.
func (s *pgServer) inserting(t *testing.T, p *phase, r countlimit.Rule, d time.Duration) {
	t.Helper()
	s.inTx(t, d, false, func(ctx context.Context, tx pgx.Tx) {
		if res, err := countlimit.New(pgstore.New(tx)).Allow(ctx, r, p.heldID); err != nil || !res.Allowed || res.Used != 1 {
			t.Fatalf("the first check of %s in a transaction: %+v, %v; want the first count, on a new row", p.heldID, res, err)
		}
		p.heldLive.Store(true)
	})
}

// holding runs sql in a transaction of its own, holds the transaction open
// for d, and returns the rows sql affected.
func (s *pgServer) holding(t *testing.T, d time.Duration, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	s.inTx(t, d, true, func(ctx context.Context, tx pgx.Tx) {
		tag, err := tx.Exec(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		n = tag.RowsAffected()
	})
	return n
}

// inTx runs do in a transaction of its own, on a connection outside the
// pool under test, holds the transaction open for d, and then commits it,
// or rolls it back when commit is false.
func (s *pgServer) inTx(t *testing.T, d time.Duration, commit bool, do func(ctx context.Context, tx pgx.Tx)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	c, err := s.admin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	do(ctx, tx)
	time.Sleep(d)
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// counts reads already_count of every given id that has a row.
func (s *pgServer) counts(ctx context.Context, ut countlimit.UseType, ids []string) (map[string]int64, error) {
	c, err := s.admin(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT unique_id, already_count FROM count_limit WHERE use_type = $1 AND unique_id = ANY($2)`, string(ut), ids)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}
