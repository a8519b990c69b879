package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/internal/store/pgmigrate"
)

// Migrate applies every pending countlimit migration to the database of
// pool, in the schema first on its search_path. A transaction of its own
// holds an advisory lock meanwhile (pg_advisory_xact_lock), so several
// processes may call it at start-up at once, also through a connection
// pooler in transaction mode, where a session's lock would not hold. It
// migrates on connections of its own, with pool's settings (four at most;
// the lock takes one), which prepare no named statement. The migrations are goose's, recorded in
// their own version table, countlimit_goose_version, apart from any goose
// table of the application's. To roll them back or list them, run the
// countlimit command's migrate down and migrate status.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	p, closeDB, err := pgmigrate.NewProvider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate up: %w", err)
	}
	return nil
}
