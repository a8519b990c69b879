package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/internal/pgmigrate"
)

// Migrate applies every pending countlimit migration to the database of
// pool, in the schema first on its search_path. It holds a session advisory
// lock meanwhile, so several processes may call it at start-up at once.
// The migrations are goose's, recorded in their own version table,
// countlimit_goose_version, apart from any goose table of the
// application's. To roll them back or list them, run the countlimit
// command's migrate down and migrate status.
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
