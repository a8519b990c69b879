// Package pgstore is the PostgreSQL countlimit.Store, the durable one: its
// counters are rows of the count_limit table that DBAs can audit with plain
// SQL (see the count_limit_status view).
//
// Every Allow, AllowN, AllowAll, Peek, Refund and CheckLimit is one SQL
// statement and one round trip, with no BEGIN/COMMIT of its own. Give New a
// pgx.Tx and the check commits or rolls back with your business write:
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	res, err := countlimit.New(pgstore.New(tx)).Allow(ctx, pinRule, userID)
//	// ... write the pin in tx ...
//	tx.Commit(ctx)
//
// Apply the schema first with Migrate.
//
// Checks need READ COMMITTED, PostgreSQL's default isolation level. In a
// REPEATABLE READ or SERIALIZABLE transaction, concurrent checks of one id
// fail with a serialization error (SQLSTATE 40001, wrapped in
// countlimit.ErrUnavailable) and the caller's transaction must be retried;
// a fail-open policy would then over-admit.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/db"
)

var _ countlimit.Store = (*Store)(nil)

// DBTX is what a Store runs its statements on: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is a countlimit.Store on PostgreSQL. It is safe for concurrent use
// when its DBTX is (a pool is; a single *pgx.Conn or pgx.Tx is not). It is
// cheap: make one per transaction.
type Store struct {
	db DBTX
	q  *db.Queries
}

// New returns a Store that runs its statements on d.
func New(d DBTX) *Store { return &Store{db: d, q: db.New()} }

// Do implements countlimit.Store: one statement per request.
func (s *Store) Do(ctx context.Context, reqs []*countlimit.Request) error {
	for _, r := range reqs {
		if err := s.do(ctx, r); err != nil {
			return interpretError(err)
		}
	}
	return nil
}

func (s *Store) do(ctx context.Context, r *countlimit.Request) error {
	useTypes := make([]string, len(r.Checks))
	for i := range r.Checks {
		useTypes[i] = string(r.Checks[i].UseType)
	}
	if r.Op == countlimit.OpReset {
		return s.q.Reset(ctx, s.db, db.ResetParams{UniqueID: r.ID, UseTypes: useTypes})
	}
	p := db.ApplyParams{
		Op:       r.Op.String(),
		UniqueID: r.ID,
		Now:      timestamptz(r.Now),
		N:        r.N,
		UseTypes: useTypes,
		Limits:   make([]int64, len(r.Checks)),
		Begins:   make([]pgtype.Timestamptz, len(r.Checks)),
		Lengths:  make([]int64, len(r.Checks)),
		Spans:    make([]int64, len(r.Checks)),
		Blocks:   make([]int64, len(r.Checks)),
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		p.Limits[i] = c.Limit
		p.Begins[i] = timestamptz(c.Begin)
		if !c.End.IsZero() {
			p.Lengths[i] = c.End.Sub(c.Begin).Microseconds()
		}
		p.Spans[i] = c.Span.Microseconds()
		p.Blocks[i] = c.Block.Microseconds()
	}
	rows, err := s.q.Apply(ctx, s.db, p)
	if err != nil {
		return err
	}
	if len(rows) != len(r.Checks) {
		return fmt.Errorf("pgstore: countlimit_apply returned %d rows for %d checks", len(rows), len(r.Checks))
	}
	for _, row := range rows {
		k := int(row.Ord) - 1
		if k < 0 || k >= len(r.Checks) {
			return fmt.Errorf("pgstore: countlimit_apply returned check %d of %d", row.Ord, len(r.Checks))
		}
		r.Checks[k].State = countlimit.State{
			Allowed:      row.Allowed,
			Used:         row.Used,
			Begin:        timeOf(row.WindowBegin),
			End:          timeOf(row.WindowEnd),
			BlockedUntil: timeOf(row.BlockedUntil),
			FreeAt:       timeOf(row.FreeAt),
		}
	}
	return nil
}

// Ping checks that the database answers and holds countlimit's schema (run
// Migrate if not): a health check that fails before checks would.
func (s *Store) Ping(ctx context.Context) error {
	ready, err := s.q.SchemaReady(ctx, s.db)
	if err != nil {
		return interpretError(err)
	}
	if !ready {
		return countlimit.Unavailable(errors.New(`pgstore: countlimit's schema is missing here (run pgstore.Migrate or "countlimit migrate up")`))
	}
	return nil
}

// Purge deletes rows whose window and penalty ended before now, in batches
// of batchSize rows until none is left, and returns how many it deleted.
// Each batch is one statement that skips rows live checks hold locked, so
// Purge never waits on live traffic. Lifetime rows are never purged. On a
// pgx.Tx all batches share the caller's transaction.
func (s *Store) Purge(ctx context.Context, now time.Time, batchSize int) (int64, error) {
	var total int64
	for {
		n, err := s.PurgeBatch(ctx, now, batchSize)
		total += n
		if err != nil || n < int64(batchSize) {
			return total, err
		}
	}
}

// PurgeBatch is one batch of Purge: it deletes at most batchSize expired rows
// that no one holds locked.
func (s *Store) PurgeBatch(ctx context.Context, now time.Time, batchSize int) (int64, error) {
	if batchSize < 1 || batchSize > 1<<20 {
		return 0, fmt.Errorf("pgstore: purge: %w: batchSize must be 1 to %d, got %d", countlimit.ErrInvalid, 1<<20, batchSize)
	}
	n, err := s.q.PurgeExpired(ctx, s.db, db.PurgeExpiredParams{Now: timestamptz(now), BatchSize: int32(batchSize)})
	if err != nil {
		return n, fmt.Errorf("pgstore: purge: %w", interpretError(err))
	}
	return n, nil
}

// interpretError maps every driver error to countlimit.ErrUnavailable,
// keeping the cause for errors.As (a *pgconn.PgError, a context error).
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("pgstore: unexpected empty result: %w", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42883" || pgErr.Code == "42P01") { // undefined function or table
		err = fmt.Errorf("pgstore: countlimit's schema is missing here (run pgstore.Migrate or \"countlimit migrate up\"): %w", err)
	}
	return countlimit.Unavailable(err)
}

func timestamptz(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }

func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid || t.InfinityModifier != pgtype.Finite {
		return time.Time{}
	}
	return t.Time
}
