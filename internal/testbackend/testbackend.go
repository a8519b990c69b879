// Package testbackend finds PostgreSQL and Redis for tests, in one place:
//
//  1. the URL in COUNTLIMIT_TEST_POSTGRES_URL / COUNTLIMIT_TEST_REDIS_URL;
//  2. else a testcontainers-go container, where a Docker engine answers;
//  3. else the test is skipped with a message saying so — or fails, when
//     COUNTLIMIT_REQUIRE_BACKENDS=1 (as in CI).
//
// Each test process works in a PostgreSQL schema of its own, so packages
// tested in parallel never see each other's tables. Call Main from TestMain
// so schemas and containers are removed when the tests end.
package testbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"

	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// The environment variables the helpers read.
const (
	EnvPostgres = "COUNTLIMIT_TEST_POSTGRES_URL"
	EnvRedis    = "COUNTLIMIT_TEST_REDIS_URL"
	EnvRequire  = "COUNTLIMIT_REQUIRE_BACKENDS"
)

var (
	mu       sync.Mutex
	cleanups []func()

	pgOnce  sync.Once
	pgURL   string
	pgErr   error
	rdOnce  sync.Once
	rdURL   string
	rdErr   error
	dkOnce  sync.Once
	dkErr   error
	shOnce  sync.Once
	shared  string // the schema this process's tests share
	shErr   error
	sharedP *pgxpool.Pool
)

// Main runs the tests, removes what the helpers created, and exits.
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// Cleanup removes schemas, pools and containers the helpers created, newest
// first. Main calls it.
func Cleanup() {
	mu.Lock()
	fs := cleanups
	cleanups = nil
	mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

func atExit(f func()) {
	mu.Lock()
	defer mu.Unlock()
	cleanups = append(cleanups, f)
}

// Required reports whether a missing backend must fail the test.
func Required() bool { return os.Getenv(EnvRequire) == "1" }

// Unavailable skips t, or fails it when backends are required.
func Unavailable(t testing.TB, what string, why error) {
	t.Helper()
	if Required() {
		t.Fatalf("%s is required (%s=1) but unavailable: %v", what, EnvRequire, why)
	}
	t.Skipf("skipping: %s unavailable: %v", what, why)
}

// PostgresURL returns the URL of a PostgreSQL server, or skips t.
func PostgresURL(t testing.TB) string {
	t.Helper()
	pgOnce.Do(func() { pgURL, pgErr = findPostgres() })
	if pgErr != nil {
		Unavailable(t, "PostgreSQL", pgErr)
	}
	return pgURL
}

// RedisURL returns the URL of a Redis server, or skips t.
func RedisURL(t testing.TB) string {
	t.Helper()
	rdOnce.Do(func() { rdURL, rdErr = findRedis() })
	if rdErr != nil {
		Unavailable(t, "Redis", rdErr)
	}
	return rdURL
}

func findPostgres() (string, error) {
	return fromEnvOrContainer(EnvPostgres, func(ctx context.Context) (string, error) {
		c, err := tcpostgres.Run(ctx, "postgres:15-alpine", tcpostgres.WithDatabase("countlimit"), tcpostgres.BasicWaitStrategies())
		if c != nil {
			atExit(func() { _ = testcontainers.TerminateContainer(c) })
		}
		if err != nil {
			return "", fmt.Errorf("testcontainers postgres: %w", err)
		}
		return c.ConnectionString(ctx, "sslmode=disable")
	})
}

func findRedis() (string, error) {
	return fromEnvOrContainer(EnvRedis, func(ctx context.Context) (string, error) {
		c, err := tcredis.Run(ctx, "redis:7-alpine")
		if c != nil {
			atExit(func() { _ = testcontainers.TerminateContainer(c) })
		}
		if err != nil {
			return "", fmt.Errorf("testcontainers redis: %w", err)
		}
		return c.ConnectionString(ctx)
	})
}

// fromEnvOrContainer returns the URL in env, else starts a container where
// a Docker engine answers.
func fromEnvOrContainer(env string, start func(context.Context) (string, error)) (string, error) {
	if u := os.Getenv(env); u != "" {
		return u, nil
	}
	if err := docker(); err != nil {
		return "", fmt.Errorf("%s is not set, and testcontainers found no Docker engine: %w", env, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return start(ctx)
}

// docker reports whether a Docker engine answers. testcontainers panics on
// some hosts without one; that is an answer too.
func docker() error {
	dkOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				dkErr = fmt.Errorf("%v", r)
			}
		}()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			dkErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		dkErr = p.Health(ctx)
	})
	return dkErr
}

// Postgres returns a pool on this process's own schema with countlimit's
// migrations applied. The pool is shared by the process's tests; isolate
// state with unique UseTypes or ids.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := PostgresURL(t)
	shOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shared = schemaName()
		if shErr = createSchema(ctx, url, shared); shErr != nil {
			return
		}
		if sharedP, shErr = poolOn(ctx, url, shared); shErr != nil {
			return
		}
		shErr = pgstore.Migrate(ctx, sharedP)
	})
	if shErr != nil {
		t.Fatalf("PostgreSQL at %s: %v", redact(url), shErr)
	}
	return sharedP
}

// PostgresPool returns another pool on the schema Postgres uses: a second
// client to the same counters. It is closed when t ends.
func PostgresPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := poolOn(ctx, PostgresURL(t), shared)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// FreshSchema returns a pool on a new, empty schema (no migrations), dropped
// when t ends.
func FreshSchema(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := schemaName()
	if err := createSchema(ctx, url, name); err != nil {
		t.Fatalf("PostgreSQL at %s: %v", redact(url), err)
	}
	p, err := poolOn(ctx, url, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// FreshSchemaURL returns a URL for a new, empty schema (no migrations),
// dropped when the test process ends: for code under test that opens its
// own connections, like the CLI.
func FreshSchemaURL(t testing.TB) string {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := schemaName()
	if err := createSchema(ctx, url, name); err != nil {
		t.Fatalf("PostgreSQL at %s: %v", redact(url), err)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + name
}

// PoolConfig returns a pool config for url on the schema Postgres uses, for
// tests that need their own settings (a tracer, say).
func PoolConfig(t testing.TB) *pgxpool.Config {
	t.Helper()
	Postgres(t)
	cfg, err := pgxpool.ParseConfig(PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = shared
	return cfg
}

func schemaName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "countlimit_test_" + hex.EncodeToString(b[:])
}

// createSchema creates schema name and registers its removal at exit.
func createSchema(ctx context.Context, url, name string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return err
	}
	atExit(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, url); err == nil {
			_, _ = conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
			conn.Close(ctx)
		}
	})
	return nil
}

func poolOn(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, err
	}
	atExit(p.Close)
	return p, nil
}

// redact hides a password in a URL for messages.
func redact(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "(unparsable URL)"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
