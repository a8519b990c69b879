package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// TestBusy: what a statement on the pool that gave up a lock reports is
// busy, wrapped or not, whatever language the server's messages are in; a
// statement_timeout is not, nor other errors. A query_canceled is told from
// a statement_timeout by how long the statement ran against the sessions'
// setting, never by its message.
func TestBusy(t *testing.T) {
	ctx := context.Background()
	pool := func(timeout string) *Store {
		cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		cfg.ConnConfig.RuntimeParams["statement_timeout"] = timeout
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return New(p, WithMaxBatch(1))
	}
	none, short := pool("0"), pool("100ms")
	lockTimeout := &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
	// The messages of a server whose lc_messages is French, and English.
	canceled := &pgconn.PgError{Code: "57014", Message: "annulation de la requête à la demande de l'utilisateur"}
	timedOut := &pgconn.PgError{Code: "57014", Message: "annulation de la requête à cause du délai écoulé pour l'exécution de l'instruction"}
	english := &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}
	// ago is how long before busy is called the statement was sent: the
	// instant is taken at the call, as the Store takes it at the error, not
	// once before the table, whose earlier cases open the pools'
	// connections (hundreds of ms in a loaded CI container, which made a
	// statement "sent now" look older than the 100 ms statement_timeout).
	const now, long = time.Duration(0), time.Second
	for _, tc := range []struct {
		name string
		s    *Store
		err  error
		ago  time.Duration
		want bool
	}{
		{"lock timeout", none, lockTimeout, now, true},
		{"lock timeout, wrapped", short, fmt.Errorf("apply: %w", lockTimeout), long, true},
		{"cancel, no statement_timeout", none, canceled, long, true},
		{"cancel, before the statement_timeout", short, canceled, now, true},
		{"statement_timeout, in French", short, timedOut, long, false},
		{"statement_timeout, in English", short, english, long, false},
		{"deadlock", none, &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, now, false},
		{"not PostgreSQL's", none, fmt.Errorf("timeout: context deadline exceeded"), now, false},
		{"nil", none, nil, now, false},
	} {
		if got := tc.s.busy(ctx, tc.err, time.Now().Add(-tc.ago)); got != tc.want {
			t.Errorf("%s: busy(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// settingsReads counts the statements that read pg_settings.
type settingsReads struct{ n atomic.Int64 }

func (r *settingsReads) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "pg_settings") {
		r.n.Add(1)
	}
	return ctx
}

func (r *settingsReads) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestBusyReadsTheSettingOnce: a burst of cancels reads the sessions'
// statement_timeout once, not once a cancel (a round trip each, when the
// pool is busiest), and tells each one the same.
func TestBusyReadsTheSettingOnce(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "100ms"
	reads := new(settingsReads)
	cfg.ConnConfig.Tracer = reads
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	s := New(p, WithMaxBatch(1))
	canceled := &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}
	for i := range 5 {
		sent := time.Now()
		if i%2 == 1 {
			sent = sent.Add(-time.Second)
		}
		if got, want := s.busy(ctx, canceled, sent), i%2 == 0; got != want {
			t.Errorf("cancel %d: busy = %v, want %v", i, got, want)
		}
	}
	if n := reads.n.Load(); n != 1 {
		t.Errorf("5 cancels read statement_timeout %d times, want once", n)
	}
}
