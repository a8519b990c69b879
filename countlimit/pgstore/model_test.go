package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/model"

	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestModel holds every PostgreSQL path to the reference model
// (internal/testkit/modeltest): a lone call on the pool
// (countlimit_allow_one_pooled), group commits of distinct and repeated
// keys (countlimit_allow_distinct_pooled, countlimit_allow_batch_pooled),
// the same while another transaction holds the row of one call's key
// (the calls beside it decided by countlimit_allow_distinct and
// countlimit_allow_batch; it found busy, then sent again), every fast
// call through countlimit_allow_one skipping locks alone (which the pool
// sends after countlimit_allow_one_pooled's first statement, and which
// meets a row that exists and is free when another transaction lets it
// go between the two), countlimit_apply for every call it can take, a
// Store on one connection (AllowOne that waits for locks), and a check
// inside a caller's transaction. Each path tallies the cases of the
// statements it reached (casesOf); with modeltest.EnvCover set, the
// tallies and plpgsql_check's profile of every function are written for
// internal/testkit/coverreport.
func TestModel(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, testbackend.PoolConfig(t).ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	onPool := pgstore.New(pool)
	read := func(ctx context.Context, ut, id string) (model.Key, error) {
		return readKey(ctx, pool, ut, id)
	}
	single := func(s *pgstore.Store) func(context.Context, *driver.Request) error {
		return s.Do
	}
	poolEach := modeltest.Each(single(onPool))
	// fastOnly skips what the group-commit statements do not take
	// (pgstore sends a smooth check to countlimit_apply).
	fastOnly := func(reqs []*driver.Request) bool {
		for _, r := range reqs {
			if r.Op != driver.OpAllow || len(r.Checks) != 1 || r.Checks[0].Span > 0 || r.Checks[0].TTL > 0 || r.Checks[0].Smooth() {
				return true
			}
		}
		return false
	}
	held, heldCalls := heldSends(pool, onPool)
	modeltest.Run(t, []modeltest.Path{
		{Name: "pool", Do: poolEach, Read: read,
			Cases: casesOf(eachPooled, nil), AllCases: fastCases},
		{Name: "group commit", Do: mixedSends(onPool), Read: read,
			Skip: func(reqs []*driver.Request) bool { return !separable(reqs) }, Fallback: poolEach,
			Cases: casesOf(together, nil), AllCases: fastCases},
		{Name: "group commit, a row held", Do: held, Read: read, Skip: fastOnly, Fallback: poolEach,
			Cases: casesOf(together, heldCalls), AllCases: fastCases},
		{Name: "countlimit_allow_one skipping locks", Do: modeltest.Each(onPool.AllowOneSkippingLockedForTest), Read: read,
			Skip: fastOnly, Fallback: poolEach, Cases: casesOf(eachSkips, nil), AllCases: fastCases},
		{Name: "countlimit_apply", Read: read,
			Do: modeltest.Each(onPool.ApplyForTest),
			Skip: func(reqs []*driver.Request) bool {
				for _, r := range reqs {
					if r.Op == driver.OpReset || r.OnLeases() {
						return true
					}
				}
				return false
			},
			Fallback: poolEach,
			Cases: func(reqs []*driver.Request, before [][]model.Key) []string {
				// Every call goes to countlimit_apply, the fast ones too.
				var out []string
				for i, r := range reqs {
					for c := range r.Checks {
						for _, a := range modeltest.Arms(before[i][c], r, &r.Checks[c]) {
							out = append(out, stmtApply+": "+a)
						}
					}
				}
				return out
			},
			AllCases: fastCases},
		{Name: "connection", Do: modeltest.Each(single(pgstore.New(conn))), Read: read,
			Cases: casesOf(eachWaits, nil), AllCases: fastCases},
		{Name: "transaction", Read: read, Do: modeltest.Each(func(ctx context.Context, r *driver.Request) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if err := pgstore.New(tx).Do(ctx, r); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}), Cases: casesOf(eachWaits, nil), AllCases: fastCases},
	})
	writeProfile(t, pool)
}

// readKey reads what PostgreSQL keeps of (ut, id), in the model's terms.
func readKey(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, ut, id string) (model.Key, error) {
	var (
		k                  model.Key
		begin, end, blockd pgtype.Timestamptz
		events             []time.Time
		smooth             bool
	)
	err := db.QueryRow(ctx, `SELECT already_count, begin_time, end_time, events, denied_count, blocked_until,
			coalesce(window_kind = 'smooth', false)
		FROM count_limit WHERE use_type = $1 AND unique_id = $2`, string(ut), id).
		Scan(&k.Count, &begin, &end, &events, &k.Denied, &blockd, &smooth)
	if errors.Is(err, pgx.ErrNoRows) {
		return model.Key{}, nil
	}
	if err != nil {
		return k, err
	}
	k.Begin = begin.Time.UnixMicro()
	k.End = model.Forever
	if end.Valid {
		k.End = end.Time.UnixMicro()
	}
	if smooth {
		// A smooth row: its TAT in end_time, its units undrained when
		// last written over [epoch, TAT) (docs/ARCHITECTURE.md, "Smooth keys").
		k.TAT = k.End
	}
	if blockd.Valid {
		k.Blocked = blockd.Time.UnixMicro()
	}
	for _, e := range events {
		k.Log = append(k.Log, e.UnixMicro())
	}
	rows, err := db.Query(ctx, `SELECT lease_token, expires_at FROM count_limit_lease WHERE use_type = $1 AND unique_id = $2`, string(ut), id)
	if err != nil {
		return k, err
	}
	defer rows.Close()
	for rows.Next() {
		var token string
		var exp time.Time
		if err := rows.Scan(&token, &exp); err != nil {
			return k, err
		}
		if k.Leases == nil {
			k.Leases = map[string]int64{}
		}
		k.Leases[token] = exp.UnixMicro()
	}
	return k, rows.Err()
}

// TestContract runs storetest's contract cases on a pool's Store and on a
// Store of one connection: seeded rows, one request, and the rows compared
// with model.Apply's state.
func TestContract(t *testing.T) {
	pool := testbackend.Postgres(t)
	in := modeltest.Inspector{
		Read: func(ctx context.Context, ut, id string) (model.Key, error) { return readKey(ctx, pool, ut, id) },
		Seed: func(ctx context.Context, ut, id string, k model.Key) error { return seedKey(ctx, pool, ut, id, k) },
	}
	t.Run("pool", func(t *testing.T) { modeltest.RunContract(t, pgstore.New(pool), in) })
	t.Run("connection", func(t *testing.T) {
		conn, err := pgx.ConnectConfig(context.Background(), testbackend.PoolConfig(t).ConnConfig.Copy())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		// One connection serves one call at a time.
		modeltest.RunContract(t, serial{mu: new(sync.Mutex), s: pgstore.New(conn)}, in)
	})
}

// serial lets one call at a time through to s.
type serial struct {
	mu *sync.Mutex
	s  driver.Store
}

func (s serial) Do(ctx context.Context, r *driver.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Do(ctx, r)
}

// seedKey makes PostgreSQL keep k for (ut, id), as its statements would
// have written it: a key with a smooth instant (TAT) as a smooth row
// (docs/ARCHITECTURE.md, "Smooth keys").
func seedKey(ctx context.Context, pool *pgxpool.Pool, ut, id string, k model.Key) error {
	return seedRow(ctx, pool, ut, id, k, true)
}

// seedV010 makes a database at v0.1.0 (migration 00001) keep k for (ut,
// id), as v0.1.0's statements wrote it. v0.1.0 had no smooth windows: a
// key with a TAT cannot be written so.
func seedV010(ctx context.Context, pool *pgxpool.Pool, ut, id string, k model.Key) error {
	if k.TAT != 0 {
		return fmt.Errorf("v0.1.0 kept no smooth instant, and (%s, %s) has one", ut, id)
	}
	return seedRow(ctx, pool, ut, id, k, false)
}

// execer runs a statement: a pool, a connection or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// seedRow writes k for (ut, id) through db; smooth says whether the
// schema has smooth rows (v0.2.0 onwards), written only for a key with a
// TAT.
func seedRow(ctx context.Context, pool execer, ut, id string, k model.Key, smooth bool) error {
	if _, err := pool.Exec(ctx, `DELETE FROM count_limit WHERE use_type = $1 AND unique_id = $2`, ut, id); err != nil {
		return err
	}
	if keystate.Empty(&k) {
		return nil
	}
	ts := func(us int64) pgtype.Timestamptz {
		if us == 0 || us == model.Forever {
			return pgtype.Timestamptz{}
		}
		return pgtype.Timestamptz{Time: time.UnixMicro(us), Valid: true}
	}
	var events []time.Time
	if k.Log != nil {
		events = []time.Time{} // a log with nothing in it, as a refund of every event leaves one
	}
	for _, e := range k.Log {
		events = append(events, time.UnixMicro(e))
	}
	var leaseUntil int64
	for _, e := range k.Leases {
		leaseUntil = max(leaseUntil, e)
	}
	begin := pgtype.Timestamptz{Time: time.UnixMicro(k.Begin), Valid: true}
	end := ts(k.End)
	if k.End == 0 {
		end = pgtype.Timestamptz{Time: time.UnixMicro(0), Valid: true}
	}
	var kind *string
	if smooth && k.TAT != 0 {
		if k.Begin != 0 || k.End != k.TAT || len(k.Log) > 0 {
			return fmt.Errorf("(%s, %s) has a TAT beside a window other than [0, TAT) or a log, which no store keeps", ut, id)
		}
		kind = new(string)
		*kind = "smooth"
	}
	if _, err := pool.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value,
		denied_count, blocked_until, events, lease_until, window_kind) VALUES ($1, $2, $3, $4, $5, 0, $6, $7, $8, $9, $10)`,
		ut, id, k.Count, begin, end, k.Denied, ts(k.Blocked), events, ts(leaseUntil), kind); err != nil {
		return err
	}
	for t, e := range k.Leases {
		if _, err := pool.Exec(ctx, `INSERT INTO count_limit_lease (use_type, unique_id, lease_token, expires_at, taken_at)
			VALUES ($1, $2, $3, $4, $4)`, ut, id, t, time.UnixMicro(e)); err != nil {
			return err
		}
	}
	return nil
}
