// Package pgmigrate runs countlimit's embedded migrations with goose: the
// Provider behind pgstore.Migrate (up) and the countlimit command's
// migrate up, down and status. It is internal so that goose's API is not
// countlimit's: a goose major version changes nothing public.
package pgmigrate

import (
	"context"
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

// NewProvider returns goose's Provider for countlimit's embedded
// migrations on pool, holding a session advisory lock while it migrates,
// and a func that releases it.
func NewProvider(pool *pgxpool.Pool) (*goose.Provider, func() error, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 600))
	if err != nil {
		return nil, nil, fmt.Errorf("pgstore: migrations: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		sqlDB.Close()
		return nil, nil, fmt.Errorf("pgstore: migrations: %w", err)
	}
	return p, sqlDB.Close, nil
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
