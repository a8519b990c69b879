// Package pgstoretest hands your integration tests a PostgreSQL schema with
// countlimit's tables, migrated and private to the test:
//
//	func TestSignup(t *testing.T) {
//		pool := pgstoretest.Pool(t) // dropped when the test ends
//		limiter := countlimit.New(pgstore.New(pool))
//		// ... your code and limiter, on real PostgreSQL
//	}
//
//	func TestMain(m *testing.M) { pgstoretest.Main(m) }
//
// The server comes from, in order:
//
//  1. the URL in COUNTLIMIT_TEST_POSTGRES_URL (a database the tests may
//     create schemas in), e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable;
//  2. else a server on the default local port that lets the postgres user
//     in without a password (postgres://postgres@127.0.0.1:5432/postgres);
//  3. else a container started with testcontainers-go, where a Docker engine
//     answers, of the image in COUNTLIMIT_TEST_POSTGRES_IMAGE (default
//     postgres:15-alpine, or any image that behaves like the official one);
//  4. else the test is skipped with a message naming both variables and
//     what was tried; with COUNTLIMIT_REQUIRE_BACKENDS=1 (for CI) it fails
//     instead.
//
// The container is started once per test binary and shared by its tests;
// Main removes it when they end. Without Main, Ryuk (testcontainers' reaper)
// removes it, where its image is present; where it is absent the helper
// disables Ryuk, so call Main, or remove leftovers by their label:
// docker rm -f $(docker ps -aq --filter label=org.countlimit.test).
//
// Every schema has a random name, so tests may run in parallel (t.Parallel)
// and several test binaries may share one server. Only this package, not
// pgstore, imports testcontainers-go.
package pgstoretest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgschema"
)

// Pool returns a pool whose connections work in a new schema with
// countlimit's migrations applied (pgstore.Migrate), as if it were the
// database's only one: your own tables, created through the pool, land in
// it too. The pool is closed and the schema dropped when t ends. Pool skips
// t when no server is found (see the package comment).
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	server, schema := newSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgschema.Pool(ctx, server, schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatalf("pgstoretest: migrate: %v", err)
	}
	return pool
}

// URL returns a connection URL for a new schema with countlimit's
// migrations applied (its search_path names the schema), for code under
// test that opens its own connections, such as a service given a --store
// URL. The schema is dropped when t ends, so close what you opened on it by
// then (register that with t.Cleanup after calling URL). URL skips t when
// no server is found.
func URL(t testing.TB) string {
	t.Helper()
	server, schema := newSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgschema.Pool(ctx, server, schema)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatalf("pgstoretest: migrate: %v", err)
	}
	return pgschema.URL(server, schema)
}

// newSchema creates an empty schema, dropped when t ends.
func newSchema(t testing.TB) (server, schema string) {
	t.Helper()
	server = testenv.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema, err := pgschema.Create(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pgschema.Drop(ctx, server, schema); err != nil {
			t.Error(err)
		}
	})
	return server, schema
}

// Main runs the tests of a package (call it from TestMain), then removes
// the containers this package and redisstoretest started, and exits.
func Main(m *testing.M) { testenv.Main(m) }
