package pgstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/store/pgmigrate"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// releases are the tagged releases a database may be upgraded from: each
// one's last migration, and how a key was kept in its schema. A release
// adds its line (docs/RELEASING.md); a release whose columns changed gives
// a seed of its own.
var releases = []struct {
	tag     string
	version int64
	seed    func(ctx context.Context, pool *pgxpool.Pool, ut, id string, k model.Key) error
}{
	{"v0.1.0", 1, seedV010},
	{"v0.2.0", 2, seedKey},
}

// TestUpgradeFromReleases brings a database from each release to the
// latest migration with live state of every kind in it (counts mid-window,
// penalties, sliding logs, leases, denial tallies, written as that
// release kept them, from the model's run): every key reads back as the
// model has it, and the store then decides on those keys as the model
// does (modeltest.Upgrade).
func TestUpgradeFromReleases(t *testing.T) {
	for _, rel := range releases {
		t.Run(rel.tag, func(t *testing.T) {
			t.Parallel()
			pool, p := atRelease(t, rel.tag, rel.version)
			store := pgstore.New(pool)
			modeltest.Upgrade(t, modeltest.Path{
				Name: "pool after the upgrade from " + rel.tag,
				Do:   modeltest.Each(store.Do),
				Read: func(ctx context.Context, ut, id string) (model.Key, error) { return readKey(ctx, pool, ut, id) },
			}, func(ctx context.Context, ut, id string, k model.Key) error {
				return rel.seed(ctx, pool, ut, id, k)
			}, func(ctx context.Context) error {
				_, err := p.Up(ctx)
				return err
			})
		})
	}
}

// TestMigrationDownReturnsToEachRelease migrates a database to each
// release, then to the latest migration and down again: the schema is the
// release's exactly, as a rollback to that release's binary needs it.
func TestMigrationDownReturnsToEachRelease(t *testing.T) {
	for _, rel := range releases {
		t.Run(rel.tag, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, p := atRelease(t, rel.tag, rel.version)
			want := schemaText(t, pool)
			if _, err := p.Up(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := p.DownTo(ctx, rel.version); err != nil {
				t.Fatalf("down to %s (version %d): %v", rel.tag, rel.version, err)
			}
			if got := schemaText(t, pool); got != want {
				t.Fatalf("after up and down, the schema is not %s's:\n%s", rel.tag, lineDiff(want, got))
			}
		})
	}
}

// atRelease returns a pool on a new schema migrated to a release's last
// migration, and the migrator that took it there; the pool is closed when
// t ends.
func atRelease(t *testing.T, tag string, version int64) (*pgxpool.Pool, *goose.Provider) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testbackend.FreshSchemaURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p := migrator(t, pool)
	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatalf("migrating to %s (version %d): %v", tag, version, err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v != version {
		t.Fatalf("the database is at version %d (%v), want %s's %d", v, err, tag, version)
	}
	return pool, p
}

// migrator is goose's provider of countlimit's migrations on pool, closed
// when tb ends.
func migrator(tb testing.TB, pool *pgxpool.Pool) *goose.Provider {
	tb.Helper()
	p, closeDB, err := pgmigrate.NewProvider(pool)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = closeDB() })
	return p
}
