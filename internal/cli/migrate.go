package cli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"

	"github.com/countlimit/countlimit/countlimit/pgstore"
)

func migrate(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("migrate")
	store := storeFlag(fs)
	if len(args) == 0 {
		return usageErrorf("migrate: want up, down or status")
	}
	dir := args[0]
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if dir != "up" && dir != "down" && dir != "status" {
		return usageErrorf("migrate: want up, down or status, got %q", dir)
	}
	if !isPostgres(*store) {
		return usageErrorf("migrate: --store must be a postgres:// URL (migrations are for PostgreSQL), got %q", redactURL(*store))
	}
	pool, err := pgxpool.New(ctx, *store)
	if err != nil {
		return badStoreURL(*store, err)
	}
	defer pool.Close()
	p, closeDB, err := pgstore.NewMigrationProvider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	switch dir {
	case "up":
		res, err := p.Up(ctx)
		for _, r := range res {
			fmt.Fprintf(stdout, "applied %s (%v)\n", r.Source.Path, r.Duration.Round(1e6))
		}
		if err != nil {
			return fmt.Errorf("migrate up: %w", err)
		}
		if len(res) == 0 {
			fmt.Fprintln(stdout, "nothing to apply")
		}
	case "down":
		r, err := p.Down(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			fmt.Fprintln(stdout, "nothing to roll back")
			return nil
		}
		if err != nil {
			return fmt.Errorf("migrate down: %w", err)
		}
		fmt.Fprintf(stdout, "rolled back %s\n", r.Source.Path)
	case "status":
		st, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("migrate status: %w", err)
		}
		for _, s := range st {
			applied := "pending"
			if !s.AppliedAt.IsZero() {
				applied = "applied " + s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
			}
			fmt.Fprintf(stdout, "%-40s %s\n", s.Source.Path, applied)
		}
	}
	return nil
}
