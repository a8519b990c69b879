package pgstore

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stmts runs a Store's statements on d, prepared only where that is safe.
//
// pgx's default mode (cache_statement) prepares each statement as a named
// statement on a connection and expects to find it there again. Behind a
// connection pooler in transaction mode (pgbouncer's pool_mode =
// transaction, and most managed poolers) a statement outside a
// transaction may run on another server connection than the one before,
// and each transaction may: where the name was never prepared, or was
// prepared there by another client, it fails (SQLSTATE 26000 or 42P05).
// Unprepared, a statement costs the server its parse and plan at every
// call: 1.03-1.35x the server's CPU of a lone fast-path call, 1.19-1.23x
// for a statement after countlimit_lock_briefly (PL/pgSQL, planned once a
// session; 1.42-1.48x as an SQL function, whose body was planned with it
// at every call); little for a group commit's, which carries many calls.
//
// So at its first statement a Store looks at where its connections go
// (direct): where they reach PostgreSQL itself, and where the pool sets a
// mode of its own (default_query_exec_mode other than cache_statement),
// the Store's statements go in the connections' own mode, as any
// statement of the pool does; where something stands between (a pooler,
// a proxy, a port mapping), they go in pgx's cache_describe mode: an
// unnamed statement, parsed with its binding in the one round trip, whose
// description (parameter and column types) pgx keeps per connection, and
// which never changes, as the SQL casts every parameter and column; exec
// where the connection's description cache is off
// (description_cache_capacity=0), as pgx refuses cache_describe there.
//
// Only the Store's own statements: the caller's own, in the caller's
// transaction too, go in whatever mode the caller's pool sets.
type stmts struct {
	d DBTX
	// mode is pgx's mode for every statement, once decided: modeOwn for
	// the connection's own (no argument), else a pgx.QueryExecMode.
	mode atomic.Int32
	// looking is set while a call looks: one look at a time, so that the
	// first wave of calls does not ask the pool for a connection each
	// beside the one its statement takes.
	looking atomic.Bool
}

var _ DBTX = (*stmts)(nil)

const (
	modeUndecided = 0
	modeOwn       = -1
)

// decided returns the mode of d's statements, deciding it at the first
// call. One call at a time looks, with its own context; the calls that
// find it undecided while another looks, and those after a look that
// failed, send their statements unprepared, waiting for no look and
// taking no connection for one (a look per call would double the pool's
// load while it is undecided, and under load each look that ran out of
// time would make the next calls look again). A look that fails is tried
// again at the next call.
func (s *stmts) decided(ctx context.Context) pgx.QueryExecMode {
	if m := s.mode.Load(); m != modeUndecided {
		return pgx.QueryExecMode(m)
	}
	if !s.looking.CompareAndSwap(false, true) {
		return s.unprepared()
	}
	defer s.looking.Store(false)
	m, err := s.decide(ctx)
	if err == nil {
		s.mode.Store(int32(m))
	}
	return m
}

// unprepared is the mode of a statement sent before the mode is decided:
// the pool's own where it sets one, else unprepared (see decide).
func (s *stmts) unprepared() pgx.QueryExecMode {
	p, ok := s.d.(*pgxpool.Pool)
	if !ok {
		return pgx.QueryExecModeCacheDescribe
	}
	cfg := p.Config().ConnConfig
	switch {
	case cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement:
		return modeOwn
	case cfg.DescriptionCacheCapacity == 0:
		return pgx.QueryExecModeExec
	}
	return pgx.QueryExecModeCacheDescribe
}

// decide looks at a connection of d (see stmts).
func (s *stmts) decide(ctx context.Context) (pgx.QueryExecMode, error) {
	var conn *pgx.Conn
	switch d := s.d.(type) {
	case *pgxpool.Pool:
		c, err := d.Acquire(ctx)
		if err != nil {
			return pgx.QueryExecModeCacheDescribe, err
		}
		defer c.Release()
		conn = c.Conn()
	case *pgxpool.Conn:
		conn = d.Conn()
	case *pgx.Conn:
		conn = d
	case pgx.Tx:
		conn = d.Conn()
	default:
		// A DBTX of the caller's own making: nothing to look at.
		return pgx.QueryExecModeCacheDescribe, nil
	}
	cfg := conn.Config()
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return modeOwn, nil
	}
	unprepared := pgx.QueryExecModeCacheDescribe
	if cfg.DescriptionCacheCapacity == 0 {
		unprepared = pgx.QueryExecModeExec
	}
	ok, err := direct(ctx, conn)
	if err != nil {
		return unprepared, err
	}
	if ok {
		return modeOwn, nil
	}
	return unprepared, nil
}

// endpoints keeps what direct found, per address dialed: how a
// connection reaches the server does not change.
var endpoints sync.Map // "network address" → bool

// direct reports whether conn reaches PostgreSQL itself: the server's own
// address and port (inet_server_addr, inet_server_port; on a Unix socket
// none, and the socket's name ends in the server's port) are those conn
// dialed. A pooler, a proxy or a port mapping between shows another
// address or port: pgbouncer on 6432 of the same host, say, connects to
// the server's 5432. It asks the server once per address, one statement,
// in the simple protocol.
func direct(ctx context.Context, conn *pgx.Conn) (bool, error) {
	remote := conn.PgConn().Conn().RemoteAddr()
	key := remote.Network() + " " + remote.String()
	if v, ok := endpoints.Load(key); ok {
		return v.(bool), nil
	}
	var (
		host *string
		port *int32
		own  string
	)
	err := conn.QueryRow(ctx, `SELECT host(inet_server_addr()), inet_server_port(), current_setting('port')`,
		pgx.QueryExecModeSimpleProtocol).Scan(&host, &port, &own)
	if err != nil {
		return false, err
	}
	ok := false
	switch a := remote.(type) {
	case *net.TCPAddr:
		ok = host != nil && port != nil && net.ParseIP(*host).Equal(a.IP) && int(*port) == a.Port
	case *net.UnixAddr:
		ok = host == nil && strings.HasSuffix(a.Name, ".s.PGSQL."+own)
	}
	endpoints.Store(key, ok)
	return ok, nil
}

// args is args after the statement's mode, if any.
func (s *stmts) args(ctx context.Context, args []any) []any {
	m := s.decided(ctx)
	if m == modeOwn {
		return args
	}
	return append([]any{m}, args...)
}

func (s *stmts) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return s.d.Exec(ctx, sql, s.args(ctx, args)...)
}

func (s *stmts) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return s.d.Query(ctx, sql, s.args(ctx, args)...)
}

func (s *stmts) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return s.d.QueryRow(ctx, sql, s.args(ctx, args)...)
}
