// Package migrations holds countlimit's PostgreSQL schema as goose SQL
// migrations. pgstore.Migrate applies them; sqlc reads them as the schema.
package migrations

import "embed"

// FS holds the migration files, 00001_*.sql onwards.
//
//go:embed *.sql
var FS embed.FS
