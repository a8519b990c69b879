// Package cli is the countlimit command: it takes arguments and writers, so
// every command is tested in-process.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// Exit statuses. Operator commands that check a limit exit 0 when allowed
// and 1 when denied, so shell scripts can branch on them.
const (
	ExitOK     = 0
	ExitDenied = 1
	ExitError  = 2
)

const usage = `countlimit: may this event happen once more for this key in this period?

Usage:
  countlimit migrate up|down|status [--store postgres://...]
  countlimit help

--store defaults to $COUNTLIMIT_STORE.
`

// Run runs the command line args (without the program name) and returns the
// exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitError
	}
	var err error
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	case "migrate":
		err = migrate(ctx, args[1:], stdout)
	default:
		err = usageErrorf("unknown command %q", args[0])
	}
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "countlimit: %v\n", err)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprint(stderr, "\n"+usage)
	}
	return ExitError
}

type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// storeFlag adds --store to fs, defaulting to $COUNTLIMIT_STORE.
func storeFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("COUNTLIMIT_STORE")
	if def == "" {
		def = "memory"
	}
	return fs.String("store", def, "store: memory, postgres://... or redis://... (default $COUNTLIMIT_STORE, else memory)")
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return usageErrorf("%s: %v", fs.Name(), err)
	}
	return nil
}

func isPostgres(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

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
		return fmt.Errorf("migrate: %w", err)
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

// redactURL hides a password in a store URL.
func redactURL(u string) string {
	at := strings.LastIndex(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 || at < scheme {
		return u
	}
	userinfo := u[scheme+3 : at]
	if i := strings.Index(userinfo, ":"); i >= 0 {
		return u[:scheme+3] + userinfo[:i] + ":xxxxx" + u[at:]
	}
	return u
}
