// Package pgmigrate runs countlimit's embedded migrations with goose: the
// Provider behind pgstore.Migrate (up) and the countlimit command's
// migrate up, down and status. It is internal so that goose's API is not
// countlimit's: a goose major version changes nothing public.
package pgmigrate

import (
	"fmt"

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
