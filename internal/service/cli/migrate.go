package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"

	"github.com/countlimit/countlimit/internal/service/clikit"
	"github.com/countlimit/countlimit/internal/store/pgmigrate"
)

func migrate(ctx context.Context, args []string, stdout io.Writer) error {
	fs := clikit.NewFlagSet("migrate")
	storeURL := clikit.StoreFlag(fs, "", "postgres://...")
	pos, err := parseMixed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "up" && pos[0] != "down" && pos[0] != "status") {
		if len(pos) == 0 {
			return clikit.UsageErrorf("migrate: want up, down or status")
		}
		return clikit.UsageErrorf("migrate: want up, down or status, got %q", strings.Join(pos, " "))
	}
	dir := pos[0]
	url, err := storeURL()
	if err != nil {
		return err
	}
	if !clikit.IsPostgres(url) {
		return clikit.UsageErrorf("migrate: --store must be a postgres:// URL (migrations are for PostgreSQL), got %q", clikit.RedactURL(url))
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return clikit.BadStoreURL(url, err)
	}
	defer pool.Close()
	p, closeDB, err := pgmigrate.NewProvider(pool)
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
