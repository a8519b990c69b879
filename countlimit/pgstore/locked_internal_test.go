package pgstore

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestBusy: what a statement on the pool that gave up a lock reports is
// busy, wrapped or not; other errors, a statement_timeout among them, are
// not.
func TestBusy(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}, true},
		{fmt.Errorf("apply: %w", &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}), true},
		{&pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}, true},
		{&pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}, false},
		{&pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, false},
		{fmt.Errorf("timeout: context deadline exceeded"), false},
		{nil, false},
	} {
		if got := busy(tc.err); got != tc.want {
			t.Errorf("busy(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
