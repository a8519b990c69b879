//go:build unix

package pgmigrate

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgbouncer"
)

// TestLockExcludes: while one Provider holds the migration lock, another
// waits for it, directly and behind pgbouncer in transaction pooling
// (where a session's lock stays on one server connection, which the next
// client's statement may be given: that client would hold the lock too);
// and so does one while a session lock on the same key is held, as a
// countlimit of before the transaction lock takes. Nothing is left locked
// once they are done.
func TestLockExcludes(t *testing.T) {
	server := testenv.PostgresURL(t)
	ctx := context.Background()
	direct, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	held := func(t *testing.T) int {
		t.Helper()
		var n int
		err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND ((classid::bigint << 32) | objid::bigint) = $1`, lockID).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, via := range []string{"direct", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			url := server
			if via == "pgbouncer" {
				url = pgbouncer.Start(t, server).URL()
			}
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			open := func() *lockerOn {
				db, closeDB, err := openDB(pool)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { closeDB() })
				return &lockerOn{l: &xactLocker{}, db: db}
			}
			a, b := open(), open()
			if err := a.l.Lock(ctx, a.db); err != nil {
				t.Fatal(err)
			}
			// b's tries go to every server connection behind pgbouncer.
			if err := b.lockFor(time.Second); err == nil {
				t.Fatal("a second Provider took the lock while the first held it")
			}
			if err := a.l.Unlock(ctx, a.db); err != nil {
				t.Fatal(err)
			}
			if err := b.lockFor(10 * time.Second); err != nil {
				t.Fatalf("the lock once released: %v", err)
			}
			if err := b.l.Unlock(ctx, b.db); err != nil {
				t.Fatal(err)
			}
			if n := held(t); n != 0 {
				t.Fatalf("%d advisory locks on the key left after unlocking", n)
			}
			// A session lock, as before: excluded too.
			if _, err := direct.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID); err != nil {
				t.Fatal(err)
			}
			err = a.lockFor(time.Second)
			if _, uerr := direct.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockID); uerr != nil {
				t.Fatal(uerr)
			}
			if err == nil {
				t.Fatal("a Provider took the lock while a session held it")
			}
			// The wait a's deadline ended was cancelled and its connection
			// closed; its server process, which may have been granted the
			// lock as the session let it go, ends a moment later.
			testenv.WaitFor(t, 10*time.Second, "the server process of a cancelled wait to end", func() bool { return held(t) == 0 })
		})
	}
}

// lockerOn is a Provider's locker and connections.
type lockerOn struct {
	l  *xactLocker
	db *sql.DB
}

// lockFor takes the lock, waiting at most d.
func (o *lockerOn) lockFor(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return o.l.Lock(ctx, o.db)
}
