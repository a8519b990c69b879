package testbackend

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LockTable locks table in mode ("ACCESS EXCLUSIVE", "SHARE", ...) from a
// transaction of its own on pool, as a DBA's LOCK TABLE, ALTER TABLE or
// CREATE INDEX does. When behind is not empty, another transaction runs it
// first and stays open (a report's SELECT, a writer that has not
// committed), so that the lock is waited for, queued behind that
// transaction, not granted: LockTable returns once PostgreSQL shows it
// queued. Otherwise it returns with the lock granted.
//
// release, which also runs when t ends, ends both transactions: a queued
// lock is granted for a moment in between, as it would be. The two
// transactions take two of pool's connections until then.
func LockTable(t testing.TB, pool *pgxpool.Pool, table, mode, behind string) (release func()) {
	t.Helper()
	ctx := context.Background()
	var holder pgx.Tx
	if behind != "" {
		var err error
		if holder, err = pool.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := holder.Exec(ctx, behind); err != nil {
			_ = holder.Rollback(ctx)
			t.Fatalf("%s: %v", behind, err)
		}
	}
	dba, err := pool.Begin(ctx)
	if err != nil {
		if holder != nil {
			_ = holder.Rollback(ctx)
		}
		t.Fatal(err)
	}
	var pid int32
	if err := dba.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var lockErr error
	done := make(chan struct{})
	lock := "LOCK TABLE " + pgx.Identifier{table}.Sanitize() + " IN " + mode + " MODE"
	go func() {
		_, lockErr = dba.Exec(ctx, lock)
		close(done)
	}()
	release = sync.OnceFunc(func() {
		if holder != nil {
			_ = holder.Rollback(ctx) // the lock is granted now
		}
		<-done
		_ = dba.Rollback(ctx)
	})
	t.Cleanup(release)
	if holder == nil {
		<-done
		if lockErr != nil {
			t.Fatalf("%s: %v", lock, lockErr)
		}
		return release
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		select {
		case <-done:
			t.Fatalf("%s behind %q: granted at once (%v), want it queued", lock, behind, lockErr)
		default:
		}
		var queued bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
			WHERE pid = $1 AND locktype = 'relation' AND relation = to_regclass($2) AND NOT granted)`, pid, table).Scan(&queued)
		if err != nil {
			t.Fatal(err)
		}
		if queued {
			return release
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s behind %q: not queued after 10 s", lock, behind)
		}
	}
}
