//go:build unix

package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgbouncer"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgschema"
)

// In transaction pooling a lone client's statements go each to another
// server connection, which keeps the URL's settings; in session pooling
// they all go to one.
func TestStart(t *testing.T) {
	url := pgschema.URL(testenv.PostgresURL(t), "countlimit_bouncer_test,public")
	for _, tc := range []struct {
		mode     string
		backends int // server connections a client's 4 statements ran on
	}{{"transaction", 4}, {"session", 1}} {
		t.Run(tc.mode, func(t *testing.T) {
			b := pgbouncer.Start(t, url, "pool_mode = "+tc.mode)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, b.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			pids := map[int32]bool{}
			for range 4 {
				var (
					pid  int32
					path string
				)
				err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), current_setting('search_path')", pgx.QueryExecModeSimpleProtocol).Scan(&pid, &path)
				if err != nil {
					t.Fatal(err)
				}
				if path != "countlimit_bouncer_test, public" {
					t.Errorf("search_path = %q, want the URL's", path)
				}
				pids[pid] = true
			}
			if len(pids) != tc.backends {
				t.Errorf("4 statements of one client ran on %d server connections, want %d", len(pids), tc.backends)
			}
		})
	}
}

func TestMain(m *testing.M) { testenv.Main(m) }
