// Package pgschema gives tests PostgreSQL schemas of their own on one
// server, so test processes and tests never see each other's tables: the
// core of pgstoretest and internal/testkit/testbackend.
package pgschema

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Create creates a schema with a random name on the server at serverURL
// and returns the name.
func Create(ctx context.Context, serverURL string) (string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "countlimit_test_" + hex.EncodeToString(b[:])
	if err := exec(ctx, serverURL, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("PostgreSQL at %s: create schema: %w", Redact(serverURL), err)
	}
	return name, nil
}

// Drop drops schema name and everything in it.
func Drop(ctx context.Context, serverURL, name string) error {
	if err := exec(ctx, serverURL, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("PostgreSQL at %s: drop schema %s: %w", Redact(serverURL), name, err)
	}
	return nil
}

func exec(ctx context.Context, serverURL, sql string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// Config returns a pool config for serverURL whose connections work in
// schema (their search_path).
func Config(serverURL, schema string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL URL %s: %w", Redact(serverURL), err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return cfg, nil
}

// Pool returns a pool, pinged, whose connections work in schema.
func Pool(ctx context.Context, serverURL, schema string) (*pgxpool.Pool, error) {
	cfg, err := Config(serverURL, schema)
	if err != nil {
		return nil, err
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: %w", Redact(serverURL), err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("PostgreSQL at %s: %w", Redact(serverURL), err)
	}
	return p, nil
}

// URL returns serverURL with search_path set to schema, for code that opens
// its own connections. Both URL forms pgx takes keep their form.
func URL(serverURL, schema string) string {
	if u, err := url.Parse(serverURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return serverURL + " search_path=" + schema // a keyword/value string
}

// Redact names the server of a URL without its password, for messages.
func Redact(serverURL string) string {
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
