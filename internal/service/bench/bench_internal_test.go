package bench

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestCleanUpWaitsForCallsInFlight: a bench's clean-up waits for its
// store's connections to come back before it deletes its counters, so a
// statement still in flight when the runs ended (a batch its cut-short
// callers left behind) cannot write a row after the DELETE.
func TestCleanUpWaitsForCallsInFlight(t *testing.T) {
	ctx := context.Background()
	pool := testbackend.FreshSchema(t)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	st := &Store{Store: pgstore.New(pool), Pool: pool}
	rule := countlimit.Rule{UseType: "bench.cleanup.test", Limit: 10, Window: countlimit.Fixed(time.Minute)}
	conn, err := st.Pool.Acquire(ctx) // the batch in flight
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
	if err := cleanUp(ctx, st, countlimit.New(st.Store), []countlimit.Rule{rule}, []string{"late"}); err != nil {
		t.Fatal(err)
	}
	if err := <-landed; err != nil {
		t.Fatal(err)
	}
	var left int
	if err := st.Pool.QueryRow(ctx, `SELECT count(*) FROM count_limit WHERE use_type = $1`, string(rule.UseType)).Scan(&left); err != nil || left != 0 {
		t.Errorf("after cleanUp: %d rows left (%v), want 0", left, err)
	}
}

// TestStallIsReportedNotMeasured: a side whose every call outlasts its run
// finishes none, and its rate of 0 comes with a warning that says the store
// stalled and for how long; a side whose calls finish says nothing.
func TestStallIsReportedNotMeasured(t *testing.T) {
	var started atomic.Int32
	hang := func(ctx context.Context, _ string) (bool, error) {
		started.Add(1)
		<-ctx.Done() // a store that answers nothing until the run ends
		return false, ctx.Err()
	}
	m := measure(context.Background(), 3, 100*time.Millisecond, inTurn([]string{"a"}), hang)
	m.add(measure(context.Background(), 3, 100*time.Millisecond, inTurn([]string{"a"}), hang))
	if m.calls() != 0 || m.errs != 0 || m.rate() != 0 {
		t.Fatalf("calls %d, errors %d, rate %v: want none of each", m.calls(), m.errs, m.rate())
	}
	// (A caller that starts after its run's end makes no call: under load
	// fewer than the 6 of 3 callers in 2 runs may start.)
	if m.cut == 0 || m.cut != int(started.Load()) {
		t.Errorf("cut short: %d, calls started %d, want every one started", m.cut, started.Load())
	}
	if m.longestCut <= 0 || m.longestCut > m.elapsed {
		t.Errorf("the longest cut short ran %v, want some of the %v measured", m.longestCut, m.elapsed)
	}
	var w strings.Builder
	m.stalled(&w, "Allow", 3)
	for _, want := range []string{"Allow finished no call at 3 callers", "cut short when the time ran out", "the store stalled"} {
		if !strings.Contains(w.String(), want) {
			t.Errorf("warning %q does not say %q", w.String(), want)
		}
	}

	ok := measure(context.Background(), 2, 50*time.Millisecond, inTurn([]string{"a"}), func(context.Context, string) (bool, error) {
		time.Sleep(time.Millisecond)
		return true, nil
	})
	w.Reset()
	ok.stalled(&w, "Allow", 2)
	if ok.calls() == 0 || w.Len() != 0 {
		t.Errorf("calls that finish: %d calls, warning %q; want some calls and no warning", ok.calls(), w.String())
	}
}
