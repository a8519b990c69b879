// Package pgmigrate runs countlimit's embedded migrations with goose: the
// Provider behind pgstore.Migrate (up) and the countlimit command's
// migrate up, down and status. It is internal so that goose's API is not
// countlimit's: a goose major version changes nothing public.
package pgmigrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/countlimit/countlimit/migrations"
)

// VersionTable is goose's version table for countlimit's migrations, apart
// from any goose table of the application's own.
const VersionTable = "countlimit_goose_version"

// lockID is the advisory lock countlimit's migrations hold; it differs from
// goose's default so the application's own goose runs never wait on ours.
const lockID int64 = 0x636c6d6967 // "clmig"

// lockWait is how long a migration waits for another's lock.
const lockWait = "10min"

// NewProvider returns goose's Provider for countlimit's embedded
// migrations on the database of pool, and a func that closes what it
// opened.
//
// It works behind a connection pooler in transaction mode as well as on a
// direct connection. Its statements go on connections of its own, opened
// with pool's settings but in pgx's exec mode, which prepares no named
// statement (a pooler cannot keep one). And the lock that keeps two
// processes from migrating at once is an advisory lock held by a
// transaction of its own for as long as the migrations run
// (pg_advisory_xact_lock): a pooler keeps a transaction on one server
// connection, where a session lock taken by one statement would be left
// on whichever connection served it, and the unlock sent to another.
// Session and transaction advisory locks on one key exclude each other, so
// a countlimit of before this lock (a session lock on the same key) and
// this one never migrate at once either. That transaction holds no lock
// but the advisory one and takes no snapshot between its statements, so
// it holds back neither the migrations nor VACUUM; it waits up to 10
// minutes for the lock, and sets its own statement_timeout and
// idle_in_transaction_session_timeout to 0, so that a server default
// does not end it while the migrations run. It needs a second connection
// beside the migrations' (a pooler's pool_size of at least 2).
func NewProvider(pool *pgxpool.Pool) (*goose.Provider, func() error, error) {
	sqlDB, closeDB, err := openDB(pool)
	if err != nil {
		return nil, nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS,
		goose.WithTableName(VersionTable),
		goose.WithLocker(&xactLocker{}),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		closeDB()
		return nil, nil, fmt.Errorf("pgstore: migrations: %w", err)
	}
	return p, closeDB, nil
}

// openDB opens the Provider's connections (see NewProvider).
func openDB(pool *pgxpool.Pool) (*sql.DB, func() error, error) {
	cfg := pool.Config()
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	// The migrations' connection and the lock's, lazily, whatever pool's
	// own size.
	cfg.MinConns, cfg.MinIdleConns, cfg.MaxConns = 0, 0, 4
	own, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: migrations: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(own)
	return sqlDB, func() error {
		err := sqlDB.Close()
		own.Close()
		return err
	}, nil
}

// xactLocker is goose's lock.Locker of countlimit's migrations: the
// advisory lock lockID, held by a transaction of its own (see
// NewProvider). A Provider locks once at a time.
type xactLocker struct {
	tx *sql.Tx
}

var _ lock.Locker = (*xactLocker)(nil)

func (l *xactLocker) Lock(ctx context.Context, db *sql.DB) error {
	// database/sql rolls a transaction back when the context it began
	// with ends: the lock is held until Unlock, whatever ctx, which bounds
	// only the wait for it.
	tx, err := db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return fmt.Errorf("pgstore: migrations: taking the lock: %w", err)
	}
	_, err = tx.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, true),
		set_config('statement_timeout', '0', true), set_config('idle_in_transaction_session_timeout', '0', true)`, lockWait)
	if err == nil {
		_, err = tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lockID)
	}
	if err != nil {
		tx.Rollback()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
			err = fmt.Errorf("another process has held countlimit's migration lock (advisory lock %d) for %s: %w", lockID, lockWait, err)
		}
		return fmt.Errorf("pgstore: migrations: taking the lock: %w", err)
	}
	l.tx = tx
	return nil
}

func (l *xactLocker) Unlock(context.Context, *sql.DB) error {
	if l.tx == nil {
		return nil
	}
	err := l.tx.Rollback()
	l.tx = nil
	if err != nil {
		return fmt.Errorf("pgstore: migrations: releasing the lock: %w", err)
	}
	return nil
}

// Pending returns the embedded migrations, by file name in order, that
// the database of pool has not applied: all of them where the version
// table is missing. It only reads, one statement: it creates no table and
// takes no lock, so a health check may call it while another process
// migrates. A migration counts as applied when the version table has a
// row for it, as goose's status says.
func Pending(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("pgstore: migrations: %w", err)
	}
	applied := map[int64]bool{}
	// The simple protocol prepares nothing, which a transaction pooler
	// between here and the database could not keep.
	rows, err := pool.Query(ctx, "SELECT version_id FROM "+VersionTable, pgx.QueryExecModeSimpleProtocol)
	if err == nil {
		var versions []int64
		versions, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		for _, v := range versions {
			applied[v] = true
		}
	}
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") { // undefined table: none applied
		return nil, fmt.Errorf("pgstore: reading %s: %w", VersionTable, err)
	}
	var pending []string
	for _, f := range files {
		v, err := goose.NumericComponent(f)
		if err != nil {
			return nil, fmt.Errorf("pgstore: migrations: %w", err)
		}
		if !applied[v] {
			pending = append(pending, f)
		}
	}
	return pending, nil
}
