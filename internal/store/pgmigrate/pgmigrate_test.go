package pgmigrate_test

import (
	"context"
	"io/fs"
	"slices"
	"testing"

	"github.com/countlimit/countlimit/internal/store/pgmigrate"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/migrations"
)

func TestMain(m *testing.M) { testenv.MainNeeding(m, "PostgreSQL", testenv.FindPostgres) }

// TestPending: every migration is pending on a new schema, where goose's
// version table does not exist (and Pending does not create it); none once
// migrated; the last one once it is rolled back.
func TestPending(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testbackend.FreshSchema(t)
	all, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(all) < 2 {
		t.Fatalf("the embedded migrations: %v %v", all, err)
	}
	check := func(step string, want []string) {
		t.Helper()
		if got, err := pgmigrate.Pending(ctx, pool); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: Pending = %v, %v; want %v", step, got, err, want)
		}
	}
	check("a new schema", all)
	var table *string
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::text", pgmigrate.VersionTable).Scan(&table); err != nil || table != nil {
		t.Errorf("after Pending on a new schema, %s is %v (%v); want it not created", pgmigrate.VersionTable, table, err)
	}

	p, closeDB, err := pgmigrate.NewProvider(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB()
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	check("migrated", nil)
	if _, err := p.Down(ctx); err != nil {
		t.Fatal(err)
	}
	check("the latest rolled back", all[len(all)-1:])
}
