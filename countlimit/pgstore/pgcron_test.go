//go:build unix

package pgstore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgcluster"
)

// TestPgCronRecipeScheduled runs the guide's pg_cron recipe as written on
// a private cluster that preloads pg_cron, twice (scheduling again
// replaces the job), moves the job to every minute so the test need not
// wait for the fifth, and waits for pg_cron to run it: the run succeeds,
// and the expired rows and leases in the recipe's database are gone while
// the live ones stay. It is skipped where pg_cron is not installed
// (Debian: apt-get install postgresql-15-cron); TestPgCronRecipeJob runs
// the job's SQL without it. It waits for pg_cron's next minute, so
// -short skips it too.
func TestPgCronRecipeScheduled(t *testing.T) {
	if testing.Short() {
		t.Skip("waits up to a minute for pg_cron's schedule")
	}
	bin, err := pgcluster.Bin()
	if err != nil {
		t.Skipf("pg_cron's test needs the PostgreSQL server binaries: %v", err)
	}
	lib, err := pgcluster.LibDir(bin)
	if err != nil {
		t.Skipf("pg_cron's test cannot tell where %s loads extensions from: %v", bin, err)
	}
	if _, err := os.Stat(filepath.Join(lib, "pg_cron.so")); err != nil {
		t.Skipf("pg_cron is not installed for the server in %s (Debian: apt-get install postgresql-15-cron); TestPgCronRecipeJob tests the recipe's SQL without it", bin)
	}
	t.Parallel()
	block, _ := pgCronRecipe(t)
	m := regexp.MustCompile(`\$job\$,\s*'([^']+)'\s*\);\s*$`).FindStringSubmatch(block)
	if m == nil {
		t.Fatalf("%s: the pg_cron recipe names no database after its job:\n%s", operationsDoc, block)
	}
	database := m[1]
	c := pgcluster.Start(t, bin, "shared_preload_libraries = 'pg_cron'\ncron.database_name = 'postgres'\ncron.host = '127.0.0.1'")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE EXTENSION pg_cron"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{database}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, c.URL(database))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	wantRows, wantLeases := seedRecipe(t, pool)

	for range 2 {
		if _, err := admin.Exec(ctx, block, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("the recipe:\n%s\nfailed: %v", block, err)
		}
	}
	var jobs int
	var jobID int64
	if err := admin.QueryRow(ctx, `SELECT count(*), max(jobid) FROM cron.job WHERE jobname = 'countlimit-purge' AND database = $1`, database).Scan(&jobs, &jobID); err != nil {
		t.Fatal(err)
	}
	if jobs != 1 {
		t.Fatalf("%d jobs named countlimit-purge in %s after scheduling twice, want 1", jobs, database)
	}
	if _, err := admin.Exec(ctx, `SELECT cron.alter_job($1, schedule => '* * * * *')`, jobID); err != nil {
		t.Fatal(err)
	}
	var status, message string
	for {
		err := admin.QueryRow(ctx, `
			SELECT status, coalesce(return_message, '') FROM cron.job_run_details
			WHERE jobid = $1 AND status IN ('succeeded', 'failed')
			ORDER BY start_time LIMIT 1`, jobID).Scan(&status, &message)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) || ctx.Err() != nil {
			t.Fatalf("waiting for pg_cron to run the job: %v", err)
		}
		time.Sleep(time.Second)
	}
	if status != "succeeded" {
		t.Fatalf("pg_cron's run of the recipe: %s: %s", status, message)
	}
	rows, leases := testbackend.PurgeLeft(t, pool)
	if !slices.Equal(rows, wantRows) || !slices.Equal(leases, wantLeases) {
		t.Errorf("after pg_cron ran the recipe: %d rows (the first %v), leases %v; want rows %v and leases %v",
			len(rows), rows[:min(len(rows), 8)], leases, wantRows, wantLeases)
	}
}
