package cli

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/testbackend"
)

// TestCleanUpWaitsForCallsInFlight: a bench's clean-up waits for its
// store's connections to come back before it deletes its counters, so a
// statement still in flight when the runs ended (a batch its cut-short
// callers left behind) cannot write a row after the DELETE.
func TestCleanUpWaitsForCallsInFlight(t *testing.T) {
	ctx := context.Background()
	st, err := openStore(ctx, testbackend.FreshSchemaURL(t), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	rule := countlimit.Rule{UseType: "bench.cleanup.test", Limit: 10, Window: countlimit.Fixed(time.Minute)}
	conn, err := st.pool.Acquire(ctx) // the batch in flight
	if err != nil {
		t.Fatal(err)
	}
	landed := make(chan error, 1)
	go func() {
		defer conn.Release()
		time.Sleep(100 * time.Millisecond)
		_, err := conn.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time)
			VALUES ($1, 'late', 1, now(), now() + interval '1 minute')`, string(rule.UseType))
		landed <- err
	}()
	if err := cleanUp(ctx, st, countlimit.New(st.store), []countlimit.Rule{rule}, []string{"late"}); err != nil {
		t.Fatal(err)
	}
	if err := <-landed; err != nil {
		t.Fatal(err)
	}
	var left int
	if err := st.pool.QueryRow(ctx, `SELECT count(*) FROM count_limit WHERE use_type = $1`, string(rule.UseType)).Scan(&left); err != nil || left != 0 {
		t.Errorf("after cleanUp: %d rows left (%v), want 0", left, err)
	}
}
