package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"

	"github.com/countlimit/countlimit/internal/modeltest"
	"github.com/countlimit/countlimit/internal/testbackend"
)

// TestModel holds every PostgreSQL path to the reference model
// (internal/modeltest): a lone call on the pool (countlimit_allow_one,
// skipping locked rows), group commits of distinct and repeated keys
// (countlimit_allow_distinct, countlimit_allow_batch), countlimit_apply
// for every call it can take, a Store on one connection (AllowOne that
// waits for locks), and a check inside a caller's transaction.
func TestModel(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, testbackend.PoolConfig(t).ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	onPool := pgstore.New(pool)
	read := func(ctx context.Context, ut, id string) (driver.Key, error) {
		return readKey(ctx, pool, ut, id)
	}
	single := func(s *pgstore.Store) func(context.Context, *driver.Request) error {
		return s.Do
	}
	poolEach := modeltest.Each(single(onPool))
	// fastOnly skips what the group-commit statements do not take.
	fastOnly := func(reqs []*driver.Request) bool {
		for _, r := range reqs {
			if r.Op != driver.OpAllow || len(r.Checks) != 1 || r.Checks[0].Span > 0 || r.Checks[0].TTL > 0 {
				return true
			}
		}
		return false
	}
	modeltest.Run(t, []modeltest.Path{
		{Name: "pool", Do: poolEach, Read: read},
		{Name: "group commit", Do: onPool.AllowBatchForTest, Read: read, Skip: fastOnly, Fallback: poolEach},
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
			Fallback: poolEach},
		{Name: "connection", Do: modeltest.Each(single(pgstore.New(conn))), Read: read},
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
		})},
	})
}

// readKey reads what PostgreSQL keeps of (ut, id), in the model's terms.
func readKey(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, ut, id string) (driver.Key, error) {
	var (
		k                  driver.Key
		begin, end, blockd pgtype.Timestamptz
		events             []time.Time
	)
	err := db.QueryRow(ctx, `SELECT already_count, begin_time, end_time, events, denied_count, blocked_until
		FROM count_limit WHERE use_type = $1 AND unique_id = $2`, string(ut), id).
		Scan(&k.Count, &begin, &end, &events, &k.Denied, &blockd)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Key{}, nil
	}
	if err != nil {
		return k, err
	}
	k.Begin = begin.Time.UnixMicro()
	k.End = driver.Forever
	if end.Valid {
		k.End = end.Time.UnixMicro()
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
