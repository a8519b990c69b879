package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// errBusy is the outcome of a call on the pool whose row another
// transaction holds locked, or has inserted and not committed: nothing of
// it was applied (see countlimit_allow_batch in the migrations, and
// lockTimed).
var errBusy = errors.New("pgstore: the row is locked by another transaction")

// busy reports whether err, the error of a statement on the pool sent at
// sent, says that it gave up waiting for a lock another transaction holds:
// lock_not_available (SQLSTATE 55P03), from the lock_timeout the fast
// path's functions and lockTimed set. Nothing of the statement was written.
//
// A lock_timeout can also end a statement as query_canceled (57014): when
// the timer fires just as one lock wait ends and another begins,
// PostgreSQL finds the cancel pending without the timeout's mark (seen
// under load, "while locking tuple" in countlimit_apply, which locks rows
// one after another). A statement_timeout ends a statement with the same
// code, and only the message tells them apart, in the server's language
// (lc_messages). So a 57014 is told by time instead: it is busy unless the
// pool's sessions have a statement_timeout and the statement ran for at
// least that long (asked of the server, only on this rare path; a lock
// wait is given up within 100 ms). pgx never cancels a statement whose
// context is live (it closes the connection of one whose context ended),
// so a DBA's pg_cancel_backend is busy too and the call is sent again, as
// for a held row: nothing of a cancelled statement was written.
func (s *Store) busy(ctx context.Context, err error, sent time.Time) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "55P03":
		return true
	case "57014":
		return !s.statementTimedOut(ctx, time.Since(sent))
	}
	return false
}

// statementTimedOut reports whether a statement of the pool's that was
// cancelled after running for ran met the sessions' statement_timeout.
// When the setting cannot be read it says so, and the statement counts as
// a store failure, as any cancel it cannot tell from a timeout.
func (s *Store) statementTimedOut(ctx context.Context, ran time.Duration) bool {
	if s.pool == nil {
		return true
	}
	ms, ok := s.stmt.get()
	if !ok {
		if err := s.db.QueryRow(ctx, `SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'`).Scan(&ms); err != nil {
			return true
		}
		s.stmt.set(ms)
	}
	return ms > 0 && ran >= time.Duration(ms)*time.Millisecond
}

// stmtTimeout keeps the pool's statement_timeout, in ms, for a minute
// after it was read: cancels come in bursts under load, when the pool has
// the fewest connections to spare for reading a setting again, and the
// setting is the sessions' (the URL's, a role's), which hardly changes.
type stmtTimeout struct {
	ms, until atomic.Int64 // until: unix ns; 0 before the first read
}

const stmtTimeoutKept = time.Minute

func (t *stmtTimeout) get() (int64, bool) {
	if time.Now().UnixNano() >= t.until.Load() {
		return 0, false
	}
	return t.ms.Load(), true
}

func (t *stmtTimeout) set(ms int64) {
	t.ms.Store(ms)
	t.until.Store(time.Now().Add(stmtTimeoutKept).UnixNano())
}

// The pauses of a call whose row is locked, before it is sent again: from
// the first, doubling up to the last, and never shorter than the send
// that found the row busy. The lock is another transaction's, a caller's
// business transaction say, which commits in its own time: the call waits
// for it without a connection or a group commit's slot.
const (
	firstBusyPause = time.Millisecond
	lastBusyPause  = 32 * time.Millisecond
)

// waitLocks runs send, which sends r on the pool, until it is not errBusy.
// Of the calls of one row that found it busy, one at a time (the row's
// turn, see turns) sends again, after a pause, until the row is free or its
// context ends; the others wait for the turn in the process, with no
// connection and no group commit's slot, so a row held for long costs the
// pool one statement a pause, however many calls wait for it. A call whose
// context ends while it waits fails with countlimit.ErrLocked, which is not
// a store failure.
func (s *Store) waitLocks(ctx context.Context, r *driver.Request, send func() error) error {
	if !s.turns.waiting(r) {
		if err := send(); err != errBusy {
			return err
		}
		table, err := s.tableLocked(ctx, r)
		if err != nil {
			// pg_locks did not answer in time: the pool's connections
			// may all be waiting for a locked table. Nothing shows a row
			// another transaction holds, so the store failed.
			return fmt.Errorf("pgstore: a statement gave up waiting for a lock, and asking pg_locks why failed: %w", err)
		}
		if table {
			// Not a held row: the statement waits for the table, as any
			// statement would, and fails as an outage if its context ends
			// first.
			if err := s.do(ctx, s.db, r); err != nil {
				return fmt.Errorf("%w: %w", errTableLocked, err)
			}
			return nil
		}
	}
	done, err := s.turns.take(ctx, firstKey(r))
	if err != nil {
		return locked(r, err)
	}
	defer done()
	// The turn's first send goes at once: the call that had the turn may
	// have left because the row is free. A pause is never shorter than the
	// send before it, which held a connection while it waited for the lock
	// (countlimit.lock_wait, up to 100 ms): a held row takes at most half
	// of one connection, whatever the setting.
	for pause := firstBusyPause; ; pause = min(2*pause, lastBusyPause) {
		sent := time.Now()
		if err := send(); err != errBusy {
			if err != nil && ctx.Err() != nil {
				// It ended while sent again: still waiting for the lock.
				return locked(r, err)
			}
			return err
		}
		t := time.NewTimer(max(pause, time.Since(sent)))
		select {
		case <-ctx.Done():
			t.Stop()
			return locked(r, ctx.Err())
		case <-t.C:
		}
	}
}

// errTableLocked wraps the error of a call that waited for count_limit or
// count_limit_lease, which another transaction holds locked or waits to
// lock, and did not get it.
var errTableLocked = errors.New("pgstore: another transaction holds or waits for a lock on the table count_limit or count_limit_lease that stops writes (LOCK TABLE, ALTER TABLE, CREATE INDEX, VACUUM FULL, ...)")

// tableLocked reports whether another transaction holds, or waits for, a
// lock that stops writes (SHARE and stronger) on a table r writes:
// count_limit, and count_limit_lease for a call on leases or a Reset (its
// rows' leases go with them). A statement that gave up waiting for a lock
// then met a stall of the whole store, not a row another transaction
// holds: it waits for the table as any statement would, and a call whose
// context ends first is a store failure, which the circuit breaker and the
// fallback store are for.
//
// A lock waited for stalls the store as surely as one granted: PostgreSQL
// queues every later lock on the table that conflicts with it behind it,
// so a LOCK TABLE or ALTER TABLE waiting for a long report's transaction
// (which holds the table only to read it) stops every write until both
// are done.
//
// It runs only when a statement gave up a lock: pg_locks copies the
// server's whole lock table (about a millisecond with 2 000 locks held).
func (s *Store) tableLocked(ctx context.Context, r *driver.Request) (bool, error) {
	leases := r.OnLeases() || r.Op == driver.OpReset
	var locked bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
		WHERE locktype = 'relation'
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
		  AND (relation = to_regclass('count_limit') OR $1 AND relation = to_regclass('count_limit_lease')))`, leases).Scan(&locked)
	return locked, err
}

// turns lets one call at a time, per row, send again a call that found the
// row busy (see waitLocks).
type turns struct {
	mu sync.Mutex
	m  map[key]*turn
	// rows is len(m), read without mu: while no row is held, which is
	// nearly always, a call asks nothing more of turns.
	rows atomic.Int64
}

// turn is one row's: a token (ch holds it while a call has the turn) and
// how many calls hold it or wait for it.
type turn struct {
	ch chan struct{}
	n  int
}

// waiting reports whether calls already wait for the turn of r's row: a
// new call then joins them at once instead of sending first.
func (t *turns) waiting(r *driver.Request) bool {
	if t.rows.Load() == 0 {
		return false
	}
	k := firstKey(r)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[k] != nil
}

// take waits for k's turn, or for ctx to end; done gives the turn to the
// next call.
func (t *turns) take(ctx context.Context, k key) (done func(), err error) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[key]*turn{}
	}
	tn := t.m[k]
	if tn == nil {
		tn = &turn{ch: make(chan struct{}, 1)}
		t.m[k] = tn
		t.rows.Add(1)
	}
	tn.n++
	t.mu.Unlock()
	leave := func() {
		t.mu.Lock()
		if tn.n--; tn.n == 0 {
			delete(t.m, k)
			t.rows.Add(-1)
		}
		t.mu.Unlock()
	}
	select {
	case tn.ch <- struct{}{}:
		return func() { <-tn.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}

// locked is the error of a call that waited for its row, locked by another
// transaction, until its context ended with err.
func locked(r *driver.Request, err error) error {
	return fmt.Errorf("%w (%s, %s): %w", countlimit.ErrLocked, r.Checks[0].UseType, r.ID, err)
}

// lockTimed runs each statement on the pool after countlimit_lock_briefly
// (the baseline migration), in the same round trip and the same implicit
// transaction (a pipeline of two statements, one Sync): a statement that
// waits longer than a brief lock_timeout (2 ms, or the setting
// countlimit.lock_wait, within 1 ms to 100 ms) for a row another transaction holds, a caller's
// business transaction or a DBA's, fails with lock_not_available, nothing
// written, and waitLocks sends it again, instead of holding a pool's
// connection until its context ends and failing as an outage. It serves
// the statements that are not the fast path's, whose functions set the
// same themselves: sliding windows, AllowAll, Peek, Refund, Reset and
// leases.
//
// Where the Store's statements go in the connections' own mode (see
// stmts) the pipeline is a pgx.Batch. Elsewhere a pgx.Batch would
// prepare both statements in the pool's mode, pgx's default, which a
// transaction pooler cannot keep: both go as unnamed statements on the
// connection (pgconn), the second with binary parameters and results by
// its description, which lockTimed asks the server for once per
// statement, an unnamed statement too, and keeps. The pool's tracer, when
// it traces batches, sees that pipeline as a batch of two, as it sees a
// pgx.Batch.
type lockTimed struct {
	p      *pgxpool.Pool
	stmts  *stmts          // the Store's, on p
	tracer pgx.BatchTracer // the pool's, or nil
	descs  sync.Map        // SQL → *pgconn.StatementDescription
}

var _ DBTX = (*lockTimed)(nil)

func newLockTimed(p *pgxpool.Pool, s *stmts) *lockTimed {
	l := &lockTimed{p: p, stmts: s}
	l.tracer, _ = p.Config().ConnConfig.Tracer.(pgx.BatchTracer)
	return l
}

// lockBriefly is the pipeline's first statement.
const lockBriefly = `SELECT countlimit_lock_briefly()`

// describe returns the description of sql, asking the server on c the
// first time.
func (l *lockTimed) describe(ctx context.Context, c *pgconn.PgConn, sql string) (*pgconn.StatementDescription, error) {
	if sd, ok := l.descs.Load(sql); ok {
		return sd.(*pgconn.StatementDescription), nil
	}
	sd, err := c.Prepare(ctx, "", sql, nil)
	if err != nil {
		return nil, err
	}
	l.descs.Store(sql, sd)
	return sd, nil
}

func (l *lockTimed) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if l.stmts.decided(ctx) == modeOwn {
		return l.batch(ctx, sql, args)
	}
	pc, err := l.p.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := l.send(ctx, pc, sql, args)
	if err != nil {
		pc.Release()
		return nil, err
	}
	return rows, nil
}

// send sends the pipeline on pc and returns the second statement's rows,
// which release pc once read or closed.
func (l *lockTimed) send(ctx context.Context, pc *pgxpool.Conn, sql string, args []any) (_ *pipelineRows, err error) {
	conn := pc.Conn()
	r := &pipelineRows{pc: pc, sql: sql, args: args}
	if l.tracer != nil {
		b := &pgx.Batch{}
		b.Queue(lockBriefly)
		b.Queue(sql, args...)
		r.ctx = l.tracer.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{Batch: b})
		r.tracer = l.tracer
		defer func() {
			if err != nil {
				r.tracer.TraceBatchEnd(r.ctx, conn, pgx.TraceBatchEndData{Err: err})
			}
		}()
	}
	sd, err := l.describe(ctx, conn.PgConn(), sql)
	if err != nil {
		return nil, err
	}
	var eqb pgx.ExtendedQueryBuilder
	if err := eqb.Build(conn.TypeMap(), sd, args); err != nil {
		return nil, err
	}
	b := &pgconn.Batch{}
	b.ExecParams(lockBriefly, nil, nil, nil, nil)
	b.ExecParams(sql, eqb.ParamValues, sd.ParamOIDs, eqb.ParamFormats, eqb.ResultFormats)
	r.mrr = conn.PgConn().ExecBatch(ctx, b)
	if !r.mrr.NextResult() {
		return nil, r.mrr.Close()
	}
	tag, err := r.mrr.ResultReader().Close()
	if r.tracer != nil {
		r.tracer.TraceBatchQuery(r.ctx, conn, pgx.TraceBatchQueryData{SQL: lockBriefly, CommandTag: tag, Err: err})
	}
	if err != nil {
		r.mrr.Close()
		return nil, err
	}
	if !r.mrr.NextResult() {
		if err := r.mrr.Close(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("pgstore: no result for %q", sql)
	}
	r.Rows = pgx.RowsFromResultReader(conn.TypeMap(), r.mrr.ResultReader())
	return r, nil
}

func (l *lockTimed) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	rows, err := l.Query(ctx, sql, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	for rows.Next() {
	}
	rows.Close()
	return rows.CommandTag(), rows.Err()
}

func (l *lockTimed) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := l.Query(ctx, sql, args...)
	return batchRow{rows, err}
}

// batch sends the pipeline as a pgx.Batch, in the pool's mode.
func (l *lockTimed) batch(ctx context.Context, sql string, args []any) (pgx.Rows, error) {
	b := &pgx.Batch{}
	b.Queue(lockBriefly)
	b.Queue(sql, args...)
	br := l.p.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// batchRows are the rows of a pgx.Batch's statement. Once read, they end
// the batch, give the connection back and report, in Err, what the end of
// the implicit transaction reported too, as a query's rows do.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if !r.closed {
		r.closed = true
		r.Rows.Close()
		r.closeErr = r.br.Close()
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// pipelineRows are the rows of a lockTimed statement. Once read, they end
// the pipeline, give the connection back and report, in Err, what the end
// of the implicit transaction reported too, as a query's rows do.
type pipelineRows struct {
	pgx.Rows
	pc       *pgxpool.Conn
	mrr      *pgconn.MultiResultReader
	sql      string
	args     []any
	tracer   pgx.BatchTracer
	ctx      context.Context // the tracer's
	closed   bool
	closeErr error
}

func (r *pipelineRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *pipelineRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.closeErr = r.mrr.Close()
	if r.tracer != nil {
		conn := r.pc.Conn()
		err := r.Err()
		r.tracer.TraceBatchQuery(r.ctx, conn, pgx.TraceBatchQueryData{SQL: r.sql, Args: r.args, CommandTag: r.Rows.CommandTag(), Err: err})
		r.tracer.TraceBatchEnd(r.ctx, conn, pgx.TraceBatchEndData{Err: err})
	}
	r.pc.Release()
}

func (r *pipelineRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// batchRow is QueryRow's row of a lockTimed statement, as pgx's is of a
// query: the first row, or pgx.ErrNoRows.
type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
