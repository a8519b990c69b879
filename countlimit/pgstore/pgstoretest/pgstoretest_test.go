package pgstoretest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/pgstore/pgstoretest"
)

func schemaOf(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var s string
	if err := q.QueryRow(context.Background(), "SELECT current_schema()").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func schemaExists(t *testing.T, name string) bool {
	t.Helper()
	// A URL of a schema of its own, so this looks from outside the schemas
	// it checks.
	pool, err := pgxpool.New(context.Background(), pgstoretest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var ok bool
	err = pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", name).Scan(&ok)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// Each Pool is a schema of its own, migrated, and gone when its test ends.
func TestPool(t *testing.T) {
	var first, second string
	t.Run("use", func(t *testing.T) {
		a, b := pgstoretest.Pool(t), pgstoretest.Pool(t)
		first, second = schemaOf(t, a), schemaOf(t, b)
		if first == second {
			t.Fatalf("two Pools share schema %s", first)
		}
		for _, p := range []*pgxpool.Pool{a, b} {
			var n int
			if err := p.QueryRow(context.Background(), "SELECT count(*) FROM count_limit").Scan(&n); err != nil {
				t.Fatalf("migrated schema: %v", err)
			}
			if n != 0 {
				t.Fatalf("new schema has %d rows in count_limit, want 0", n)
			}
		}
	})
	for _, s := range []string{first, second} {
		if schemaExists(t, s) {
			t.Errorf("schema %s outlived its test", s)
		}
	}
}

// URL names a migrated schema of its own in its search_path.
func TestURL(t *testing.T) {
	var schema string
	t.Run("use", func(t *testing.T) {
		pool, err := pgxpool.New(context.Background(), pgstoretest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		schema = schemaOf(t, pool)
		if err := pool.QueryRow(context.Background(), "SELECT 1 FROM count_limit_status LIMIT 1").Scan(new(int)); err != nil && err != pgx.ErrNoRows {
			t.Fatalf("migrated schema: %v", err)
		}
	})
	if schemaExists(t, schema) {
		t.Errorf("schema %s outlived its test", schema)
	}
}
