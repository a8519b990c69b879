package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// unprepared runs a Store's statements on d in mode: never as a named
// prepared statement, which pgx's default mode (cache_statement) prepares
// on a connection and expects to find there again. Behind a connection
// pooler in transaction mode (pgbouncer's pool_mode = transaction, and
// most managed poolers), each statement outside a transaction may run on
// another server connection, and each transaction does: where the name was
// never prepared, or was prepared by another client, the statement fails
// (SQLSTATE 26000 or 42P05). So every statement of the Store goes in pgx's
// cache_describe mode: an unnamed statement, parsed with its binding in
// the one round trip, whose description (parameter and column types) pgx
// keeps per connection; its SQL casts every parameter and column, so that
// description never changes. Where the connection's description cache is
// off (description_cache_capacity=0), pgx would refuse that mode: exec
// then, whose parameters and results go as text. docs/benchmarks.md has
// what it costs on a direct connection against the prepared statement:
// within the machine's noise.
//
// Only the Store's own statements: the caller's own statements, in the
// caller's transaction too, go in whatever mode the caller's pool sets.
type unprepared struct {
	d    DBTX
	mode pgx.QueryExecMode
}

var _ DBTX = unprepared{}

// newUnprepared returns d with the mode its connections allow.
func newUnprepared(d DBTX) unprepared {
	var cfg *pgx.ConnConfig
	switch d := d.(type) {
	case *pgxpool.Pool:
		cfg = d.Config().ConnConfig
	case *pgx.Conn:
		cfg = d.Config()
	case pgx.Tx:
		cfg = d.Conn().Config()
	}
	mode := pgx.QueryExecModeCacheDescribe
	if cfg != nil && cfg.DescriptionCacheCapacity == 0 {
		mode = pgx.QueryExecModeExec
	}
	return unprepared{d: d, mode: mode}
}

func (u unprepared) args(args []any) []any {
	return append([]any{u.mode}, args...)
}

func (u unprepared) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return u.d.Exec(ctx, sql, u.args(args)...)
}

func (u unprepared) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return u.d.Query(ctx, sql, u.args(args)...)
}

func (u unprepared) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return u.d.QueryRow(ctx, sql, u.args(args)...)
}
