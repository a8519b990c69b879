package pgstore

import (
	"context"
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

// Migrate applies every pending countlimit migration to the database of
// pool, in the schema first on its search_path. It holds a session advisory
// lock meanwhile, so several processes may call it at start-up at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	p, closeDB, err := NewMigrationProvider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate up: %w", err)
	}
	return nil
}

// NewMigrationProvider returns goose's Provider for countlimit's embedded
// migrations on pool (for down and status; Migrate is up), and a func that
// releases it.
func NewMigrationProvider(pool *pgxpool.Pool) (*goose.Provider, func() error, error) {
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
