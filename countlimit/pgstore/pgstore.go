// Package pgstore is the PostgreSQL driver.Store, the durable one: its
// counters are rows of the count_limit table that DBAs can audit with plain
// SQL (see the count_limit_status view).
//
// Every Allow, AllowN, AllowAll, Peek, Refund and CheckLimit is one SQL
// statement and one round trip, with no BEGIN/COMMIT of its own: a call of
// a function of countlimit's migrations (queries/ names them, sqlc
// generates the Go). A check of one rule whose window is neither sliding
// nor smooth, the common case, is countlimit_allow_one, or on a pool
// countlimit_allow_batch or countlimit_allow_distinct for concurrent calls
// together (group commit); sliding and smooth windows, AllowAll over
// several rules, Peek and Refund call countlimit_apply, or on a pool
// countlimit_apply_batch for concurrent calls together. Give New a pgx.Tx
// and the check commits or rolls back with your business write:
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	res, err := countlimit.New(pgstore.New(tx)).Allow(ctx, pinRule, userID)
//	// ... write the pin in tx ...
//	tx.Commit(ctx)
//
// Acquire, Lease.Release and Lease.Extend of a Concurrent rule are one
// statement each too (and Peek of one), or on a pool countlimit_lease_batch
// for concurrent calls together; leases are rows of count_limit_lease.
//
// Apply the schema first with Migrate.
//
// # Group commit
//
// A Store on a *pgxpool.Pool gathers concurrent calls into batches, with
// no timers, in three batchers: one for Allow, AllowN and CheckLimit of a
// rule whose window is neither sliding nor smooth (countlimit_allow_batch
// and countlimit_allow_distinct), one for every other Allow, AllowN,
// AllowAll, Peek and Refund (countlimit_apply_batch), and one for
// Acquire, Lease.Release, Lease.Extend and Peek of a Concurrent rule
// (countlimit_lease_batch). In each, a call that
// finds no batch in flight goes at once, with any calls that are waiting;
// calls that arrive while batches are in flight leave together in the
// next batch. A second batch (see WithMaxInFlight) leaves beside the
// first only when it shares no row with it and carries as many calls: two
// batches of one batcher never lock the same row (countlimit_apply_batch's
// share no id). A batch is one statement, one transaction and one commit,
// so one WAL flush serves many calls; if it fails, every call in it gets
// countlimit.ErrUnavailable and nothing of it is committed. Calls for the
// same id and use type in one batch are decided one after another in
// arrival order, and each gets the Result it would have had alone; in
// countlimit_apply_batch and countlimit_lease_batch the calls of one id
// are, each seeing the writes of those before it. A call either cannot
// decide there, because a row of it is absent (a new key) or another
// transaction holds one, is sent alone, and so are the later calls of its id in that batch:
// nothing of them was written, and each is then a statement of its own
// (countlimit_apply or the lease's function, which create rows and wait
// for locks as below). A
// call whose context ends while it waits leaves the batch and is never
// counted. A call that may leave at once and finds no call waiting runs
// its statement on its caller's goroutine, with its caller's context: a
// lone call costs no hand-off between goroutines.
//
// Reset is not batched: it is one statement in its own transaction. A
// Store on a *pgx.Conn or a pgx.Tx never batches.
//
// # Rows another transaction holds
//
// A check inside a caller's pgx.Tx holds its id's row until that
// transaction ends: locked, or inserted and not committed when the id is
// new; a DBA's UPDATE holds a row too. A Store on a pool never lets such a
// row hold other calls: a batch skips it (and inserts its other new keys
// past an uncommitted one), and a statement of its own gives up waiting
// for it after 2 ms (a lock_timeout, set for that statement only). The
// calls of that id alone wait, in the process, without a connection or a
// batch's slot: one of them at a time is sent again after short pauses,
// until the row is free. When a waiting call's context ends first, it
// fails with countlimit.ErrLocked, which the Limiter does not count as a
// store failure: the circuit breaker stays closed and no fallback answers.
// The setting countlimit.lock_wait (ALTER ROLE ... SET countlimit.lock_wait
// = '10ms') changes the 2 ms, within 1 ms to 100 ms: 0 (for lock_timeout,
// no limit) and longer values count as 100 ms and shorter ones as 1 ms,
// since a statement that waits long holds a connection, or a batch, and
// the other ids with it; a value lock_timeout would not read counts as
// unset.
//
// A lock on the table itself (a DBA's LOCK TABLE, ALTER TABLE or CREATE
// INDEX), granted or still waited for, stalls the whole store instead:
// PostgreSQL queues every write behind a lock that waits, so an ALTER
// TABLE waiting for a long report's transaction stops every check as
// surely as one that runs. Calls wait for the table as any statement
// would, and one whose context ends first fails with
// countlimit.ErrUnavailable, a store failure, for the breaker and the
// fallback. So does a lease's call (Acquire, Release, Extend) or a Reset
// when count_limit_lease is locked. A Store on a *pgx.Conn or a pgx.Tx
// waits for any lock, as the caller's other statements do.
//
// Size the pool for the batches in flight plus the calls that are not
// batched; pgx's default (the larger of 4 and the number of CPUs) serves
// most services, and pool_max_conns in the URL changes it.
//
// # Behind a connection pooler
//
// A Store works through a connection pooler in transaction pooling
// (pgbouncer's pool_mode = transaction, and the managed poolers like it)
// as in session pooling, on pgx's default pool settings. At its first
// statement it looks at where its connections go, once per address in
// the process: where they reach PostgreSQL itself, its statements are
// prepared as pgx prepares any; where a pooler, a proxy or a port mapping
// stands between, they go unprepared, in pgx's cache_describe mode, and a
// pool that sets default_query_exec_mode keeps its own mode. It keeps
// nothing in a session between statements; a check in your transaction
// stays in it, as a pooler keeps a transaction on one server connection;
// and Migrate's lock is a transaction's. Your own statements on the same
// pool are yours to make safe there: docs/operations.md, "Behind a
// connection pooler", says how, and what it costs.
//
// # Purging
//
// Rows are never deleted by checks: count_limit keeps a row for every
// (use type, id) it ever saw until a purge deletes the expired ones. A
// deployment must purge: run PurgeEvery beside your Limiter, or let
// "countlimit serve" do it (its --purge-interval), or run "countlimit
// purge" or Purge from a scheduler. All delete in bounded batches that
// skip rows live checks hold locked, so they run beside live traffic and
// beside each other.
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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/db"
	"github.com/countlimit/countlimit/internal/store/gather"
	"github.com/countlimit/countlimit/internal/store/wire"
)

var _ driver.Store = (*Store)(nil)

// DBTX is what a Store runs its statements on: *pgxpool.Pool, *pgx.Conn and
// pgx.Tx all satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is a driver.Store on PostgreSQL. It is safe for concurrent use
// when its DBTX is (a pool is; a single *pgx.Conn or pgx.Tx is not). It is
// cheap to make: make one per transaction, and one per pool.
type Store struct {
	db     *stmts // on the DBTX New was given
	q      *db.Queries
	pool   *pgxpool.Pool   // the DBTX, when it is a pool
	timed  *lockTimed      // on pool
	gather *gather.Batcher // nil unless db is a pool
	// applies group-commits the calls batched reports (nil unless db is a
	// pool).
	applies *gather.Batcher
	// leases group-commits the calls leaseBatched reports (nil unless db
	// is a pool).
	leases *gather.Batcher
	turns  turns       // of the rows calls on the pool wait for
	stmt   stmtTimeout // the pool's statement_timeout, as last read
}

// Option configures a Store.
type Option func(*config)

type config struct {
	maxBatch, maxInFlight int
}

// WithMaxBatch sets how many calls one group commit may carry (default 256).
// 1 turns group commit off: every call is then its own transaction.
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// WithMaxInFlight sets how many group commits of each batcher (the fast
// path's, countlimit_apply_batch's, countlimit_lease_batch's) may be in flight at once, each on its
// own connection (default 2, and never more than the pool's MaxConns). Calls gather while batches run and leave together when a slot
// is free. Batches in flight never share a row, so none waits behind
// another's row locks, and a second batch leaves only as big as the one it
// overlaps; docs/benchmarks.md has how the default was chosen. 1 makes one
// batch at a time.
func WithMaxInFlight(n int) Option { return func(c *config) { c.maxInFlight = n } }

// New returns a Store that runs its statements on d. On a *pgxpool.Pool it
// gathers concurrent calls into group commits; options tune that and are
// ignored for other DBTXs.
func New(d DBTX, opts ...Option) *Store {
	s := &Store{db: &stmts{d: d}, q: db.New()}
	if p, ok := d.(*pgxpool.Pool); ok {
		s.pool = p
		s.timed = newLockTimed(p, s.db)
		cfg := config{maxBatch: 256, maxInFlight: 2}
		for _, o := range opts {
			o(&cfg)
		}
		cfg.maxInFlight = min(cfg.maxInFlight, int(p.Config().MaxConns))
		if cfg.maxBatch > 1 {
			s.gather = gather.New(s.sendBatch, cfg.maxBatch, cfg.maxInFlight)
			// A lone call on its caller's goroutine saves a hand-off
			// between goroutines (docs/benchmarks.md). pgx returns
			// promptly once ctx ends.
			s.gather.SendAlone()
			// Two batches in flight never share a row (see gather.Keyed).
			s.gather.Keyed(rowHash)
			s.applies = gather.New(s.sendApplies, cfg.maxBatch, cfg.maxInFlight)
			s.applies.SendAlone()
			s.applies.Keyed(idHash)
			s.leases = gather.New(s.sendLeases, cfg.maxBatch, cfg.maxInFlight)
			s.leases.SendAlone()
			s.leases.Keyed(idHash)
		}
	}
	return s
}

// Do implements driver.Store.
func (s *Store) Do(ctx context.Context, r *driver.Request) error {
	if s.pool == nil {
		// The caller's connection or transaction: a lock is waited for, as
		// its other statements wait.
		return interpretError(s.do(ctx, s.db, r))
	}
	return interpretError(s.waitLocks(ctx, r, func() error { return s.pooled(ctx, r) }))
}

// pooled runs one request on the pool: the fast path in a group commit, or
// on its own skipping a locked row; allows, peeks and refunds of every
// other kind in a group commit of their own, or alone when it did not
// decide them; and every other statement alone with a short lock_timeout
// (lockTimed). A row another transaction holds makes it errBusy.
func (s *Store) pooled(ctx context.Context, r *driver.Request) error {
	switch {
	case fast(r) && s.gather != nil:
		return s.gather.Do(ctx, r)
	case fast(r):
		return s.allowOne(ctx, s.db, r, onePooled)
	case s.applies != nil && batched(r):
		if err := s.applies.Do(ctx, r); err != errAlone {
			return err
		}
	case s.leases != nil && leaseBatched(r):
		if err := s.leases.Do(ctx, r); err != errAlone {
			return err
		}
	}
	return s.alone(ctx, r)
}

// do runs one request on d, a statement of its own.
func (s *Store) do(ctx context.Context, d DBTX, r *driver.Request) error {
	switch {
	case r.Op == driver.OpReset:
		return s.reset(ctx, d, r)
	case r.OnLeases(): // Reset is not: deleting a key's row deletes its leases
		return s.lease(ctx, d, r)
	case !fast(r):
		return s.apply(ctx, d, r)
	}
	return s.allowOne(ctx, d, r, oneWaits)
}

func (s *Store) reset(ctx context.Context, d DBTX, r *driver.Request) error {
	return s.q.Reset(ctx, d, db.ResetParams{UniqueID: r.ID, UseTypes: useTypes(r)})
}

// apply runs a request through countlimit_apply.
func (s *Store) apply(ctx context.Context, d DBTX, r *driver.Request) error {
	var a applyChecks
	a.add(r)
	rows, err := s.q.Apply(ctx, d, db.ApplyParams{
		Op:        r.Op.String(),
		UniqueID:  r.ID,
		Now:       timestamptz(r.Now),
		N:         r.N,
		UseTypes:  a.useTypes,
		Limits:    a.limits,
		Begins:    a.begins,
		Lengths:   a.lengths,
		Spans:     a.spans,
		Blocks:    a.blocks,
		Kinds:     a.kinds,
		Intervals: a.intervals,
		Bursts:    a.bursts,
	})
	if err != nil {
		return err
	}
	if len(rows) != len(r.Checks) {
		return fmt.Errorf("pgstore: countlimit_apply returned %d rows for %d checks", len(rows), len(r.Checks))
	}
	for _, row := range rows {
		if err := setApplied(r, row.Ord, row.Allowed, row.Used, row.WindowBegin, row.WindowEnd, row.BlockedUntil, row.FreeAt); err != nil {
			return err
		}
	}
	return nil
}

// applyChecks are requests' checks as countlimit_apply and
// countlimit_apply_batch take them, one array a field.
type applyChecks struct {
	useTypes []string
	limits   []int64
	begins   []pgtype.Timestamptz
	lengths  []int64
	spans    []int64
	blocks   []int64
	kinds    []string
	// A smooth check's emission interval (µs) and burst; 0 for every
	// other kind.
	intervals []int64
	bursts    []int64
}

// add appends r's checks.
func (a *applyChecks) add(r *driver.Request) {
	for i := range r.Checks {
		c := &r.Checks[i]
		begin, length := wire.Window(c)
		a.useTypes = append(a.useTypes, string(c.UseType))
		a.limits = append(a.limits, c.Limit)
		a.begins = append(a.begins, nullTime(begin)) // NULL for a sliding check
		a.lengths = append(a.lengths, length)
		a.spans = append(a.spans, c.Span.Microseconds())
		a.blocks = append(a.blocks, c.Block.Microseconds())
		a.kinds = append(a.kinds, c.Kind)
		a.intervals = append(a.intervals, c.Interval.Microseconds())
		a.bursts = append(a.bursts, c.Burst)
	}
}

// setApplied writes the state of r's check ord (1-based) from a row of
// countlimit_apply's.
func setApplied(r *driver.Request, ord int32, allowed bool, used int64, begin, end, blocked, freeAt pgtype.Timestamptz) error {
	k := int(ord) - 1
	if k < 0 || k >= len(r.Checks) {
		return fmt.Errorf("pgstore: countlimit_apply returned check %d of %d", ord, len(r.Checks))
	}
	r.Checks[k].State = driver.State{
		Allowed:      allowed,
		Used:         used,
		Begin:        timeOf(begin),
		End:          timeOf(end),
		BlockedUntil: timeOf(blocked),
		FreeAt:       timeOf(freeAt),
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
		return driver.Unavailable(errors.New(`pgstore: countlimit's schema is missing here or not at its latest migration (run pgstore.Migrate or "countlimit migrate up")`))
	}
	return nil
}

// MaxBatchSize is the largest batch Purge deletes in one statement, and
// the most rows an audit query returns.
const MaxBatchSize = 1 << 20

// Purge deletes rows whose window, penalty and leases ended before now, and
// expired leases, and returns how many it deleted: first the leases, in
// batches of batchSize, oldest first, until a batch finds fewer; then the
// rows, in one sweep of count_limit from its first page to its last, each
// statement reading at most 1024 pages and deleting at most batchSize
// rows (docs/ARCHITECTURE.md, "The purge sweeps the table", says why).
// Each statement skips rows live checks hold locked, so
// Purge never waits on live traffic; a row held, or moved by an update
// since the sweep passed it, goes in the next purge. Lifetime rows are
// never purged. On a pgx.Tx all statements share the caller's transaction.
func (s *Store) Purge(ctx context.Context, now time.Time, batchSize int) (int64, error) {
	return s.PurgeEach(ctx, now, batchSize, nil)
}

// PurgeEach is Purge that calls progress, when not nil, with the total
// deleted so far after every statement: for a progress line.
func (s *Store) PurgeEach(ctx context.Context, now time.Time, batchSize int, progress func(total int64)) (int64, error) {
	var (
		sw    purgeSweep
		total int64
	)
	for !sw.done {
		n, err := s.purgeStep(ctx, now, batchSize, &sw)
		total += n
		if progress != nil {
			progress(total)
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// purgeSweep is where a purge is: its leases, or the place on disk in
// count_limit its sweep goes on from.
type purgeSweep struct {
	rows bool // the leases are done: sweeping count_limit
	page int64
	item int32
	done bool
}

// purgeStep runs the next statement of a purge: a batch of at most
// batchSize expired leases while the batches find that many, then a range
// of count_limit's pages, until the sweep reaches the table's end (sw.done).
// A now outside 1970 until 2150 (UTC), as countlimit's clock readings must
// lie, is countlimit.ErrInvalid, nothing deleted.
func (s *Store) purgeStep(ctx context.Context, now time.Time, batchSize int, sw *purgeSweep) (int64, error) {
	if batchSize < 1 || batchSize > MaxBatchSize {
		return 0, fmt.Errorf("pgstore: purge: %w: batchSize must be 1 to %d, got %d", countlimit.ErrInvalid, MaxBatchSize, batchSize)
	}
	if !driver.InRange(now) {
		// A clock far ahead would purge every live window.
		return 0, fmt.Errorf("pgstore: purge: %w: now %s is outside 1970-01-01 to 2150-01-01 UTC", countlimit.ErrInvalid, now.UTC().Format(time.RFC3339))
	}
	if !sw.rows {
		n, err := s.q.PurgeLeases(ctx, s.db, db.PurgeLeasesParams{Now: timestamptz(now), BatchSize: int32(batchSize)})
		if err != nil {
			return 0, fmt.Errorf("pgstore: purge: %w", interpretError(err))
		}
		sw.rows = n < int64(batchSize)
		return n, nil
	}
	r, err := s.q.PurgeRows(ctx, s.db, db.PurgeRowsParams{Now: timestamptz(now), BatchSize: int32(batchSize), FromPage: sw.page, FromItem: sw.item})
	if err != nil {
		return 0, fmt.Errorf("pgstore: purge: %w", interpretError(err))
	}
	sw.page, sw.item, sw.done = r.NextPage, r.NextItem, r.NextPage < 0
	return r.Deleted, nil
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
	return driver.Unavailable(err)
}

func useTypes(r *driver.Request) []string {
	uts := make([]string, len(r.Checks))
	for i := range r.Checks {
		uts[i] = string(r.Checks[i].UseType)
	}
	return uts
}

func timestamptz(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }

// nullTime is t, or NULL when t is zero.
func nullTime(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()} }

// epoch is where a smooth key's window begins.
var epoch = time.Unix(0, 0)

// timeOf is t as the driver has it: zero for NULL, an infinity and the
// epoch, where a smooth key's window begins (docs/ARCHITECTURE.md, "Smooth keys"),
// and which is no time to the driver either (a State's Begin there is
// zero: a window joined from a smooth key has no begin of its own).
func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid || t.InfinityModifier != pgtype.Finite || t.Time.Equal(epoch) {
		return time.Time{}
	}
	return t.Time
}
