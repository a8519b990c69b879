package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestStatusWindowKind: count_limit_status names the kind of the rule that
// last counted in a row on every path a single-rule check takes (a lone
// call on the pool, a call in the caller's transaction, a group commit of
// distinct keys and one that repeats a key), follows a rule that changes
// kind, names the kind of each rule of an AllowAll too (countlimit_apply
// writes it since the baseline), and says "window" for CheckLimit's window
// of the caller's own; sliding, lifetime, concurrent and smooth rows keep
// their own names.
func TestStatusWindowKind(t *testing.T) {
	pool := testbackend.Postgres(t)
	ctx := context.Background()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	rolling := countlimit.Rule{UseType: "k.rolling", Limit: 5, Window: countlimit.Rolling(time.Hour)}
	fixed := countlimit.Rule{UseType: "k.fixed", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	calendar := countlimit.Rule{UseType: "k.calendar", Limit: 5, Window: countlimit.Calendar(countlimit.Day, ny)}
	lifetime := countlimit.Rule{UseType: "k.lifetime", Limit: 5, Window: countlimit.Lifetime()}
	sliding := countlimit.Rule{UseType: "k.sliding", Limit: 5, Window: countlimit.Sliding(time.Hour)}
	slots := countlimit.Rule{UseType: "k.slots", Limit: 5, Window: countlimit.Concurrent(time.Hour)}

	kind := func(ut countlimit.UseType, id string) string {
		t.Helper()
		var k string
		if err := pool.QueryRow(ctx, `SELECT window_kind FROM count_limit_status WHERE use_type = $1 AND unique_id = $2`,
			string(ut), id).Scan(&k); err != nil {
			t.Fatalf("%s/%s: %v", ut, id, err)
		}
		return k
	}
	want := func(ut countlimit.UseType, id, k string) {
		t.Helper()
		if got := kind(ut, id); got != k {
			t.Errorf("%s/%s: window_kind %q, want %q", ut, id, got, k)
		}
	}
	allow := func(l *countlimit.Limiter, r countlimit.Rule, id string) {
		t.Helper()
		if res, err := l.Allow(ctx, r, id); err != nil || !res.Allowed {
			t.Fatalf("Allow(%s, %s) = %+v, %v", r.UseType, id, res, err)
		}
	}

	// A lone call on the pool: countlimit_allow_one, lock-skipping.
	pooled := countlimit.New(pgstore.New(pool))
	for _, c := range []struct {
		r    countlimit.Rule
		kind string
	}{{rolling, "rolling"}, {fixed, "fixed"}, {calendar, "calendar"}, {lifetime, "lifetime"}} {
		allow(pooled, c.r, "pool")
		want(c.r.UseType, "pool", c.kind)
	}

	// In the caller's transaction: countlimit_allow_one, waiting.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inTx := countlimit.New(pgstore.New(tx))
	allow(inTx, fixed, "tx")
	allow(inTx, calendar, "tx") // another use type, same id
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want(fixed.UseType, "tx", "fixed")
	want(calendar.UseType, "tx", "calendar")

	// Group commits, built as the Limiter builds its requests.
	rec := &recorder{}
	l := countlimit.New(rec)
	for _, id := range []string{"d1", "d2", "d3"} {
		l.Allow(ctx, calendar, id)
	}
	store := pgstore.New(pool)
	if err := store.AllowBatchForTest(ctx, rec.reqs); err != nil { // distinct keys
		t.Fatal(err)
	}
	for _, id := range []string{"d1", "d2", "d3"} {
		want(calendar.UseType, id, "calendar")
	}
	rec.reqs = nil
	l.Allow(ctx, rolling, "r1")
	l.Allow(ctx, rolling, "r1")
	l.Allow(ctx, fixed, "r2")
	if err := store.AllowBatchForTest(ctx, rec.reqs); err != nil { // a key twice
		t.Fatal(err)
	}
	want(rolling.UseType, "r1", "rolling")
	want(fixed.UseType, "r2", "fixed")
	if got := rec.reqs[0].Checks[0].Kind; got != "rolling" {
		t.Errorf("the Limiter's Check.Kind for a rolling rule is %q", got)
	}

	// A rule that changes kind under the same use type: the row follows
	// the rule that counted last.
	changed := rolling
	changed.Window = countlimit.Fixed(time.Hour)
	allow(pooled, changed, "pool")
	want(rolling.UseType, "pool", "fixed")

	// AllowAll, through countlimit_apply: each rule's kind; and the kind
	// of the rule that counted last, when a single-rule check follows.
	other := countlimit.Rule{UseType: "k.other", Limit: 5, Window: countlimit.Fixed(time.Minute)}
	other2 := countlimit.Rule{UseType: "k.other2", Limit: 5, Window: countlimit.Rolling(time.Minute)}
	other3 := countlimit.Rule{UseType: "k.other3", Limit: 5, Window: countlimit.Calendar(countlimit.Week, ny)}
	if res, err := pooled.AllowAll(ctx, "all", other, other2, other3); err != nil || !res[0].Allowed {
		t.Fatalf("AllowAll = %+v, %v", res, err)
	}
	want("k.other", "all", "fixed")
	want("k.other2", "all", "rolling")
	want("k.other3", "all", "calendar")
	// CheckLimit: a window of the caller's own, "window".
	if ok, err := pooled.CheckLimit(ctx, "k.classic", "c", 5, time.Hour, time.Time{}); err != nil || !ok {
		t.Fatalf("CheckLimit = %v, %v", ok, err)
	}
	want("k.classic", "c", "window")

	// Kinds the view names from the row itself.
	allow(pooled, sliding, "s")
	want(sliding.UseType, "s", "sliding")
	want(lifetime.UseType, "pool", "lifetime")
	if _, res, err := pooled.Acquire(ctx, slots, "slot"); err != nil || !res.Allowed {
		t.Fatalf("Acquire = %+v, %v", res, err)
	}
	want(slots.UseType, "slot", "concurrent")

	// Smooth: countlimit_apply writes the kind, on the pool and in a
	// caller's transaction, and a rule that changes kind to smooth and
	// back (a fixed window's fast path over the smooth row) is followed.
	smooth := countlimit.Rule{UseType: "k.smooth", Limit: 5, Window: countlimit.Smooth(time.Hour, 5)}
	allow(pooled, smooth, "pool")
	want(smooth.UseType, "pool", "smooth")
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	allow(countlimit.New(pgstore.New(tx)), smooth, "tx")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want(smooth.UseType, "tx", "smooth")
	toSmooth := rolling
	toSmooth.Window = countlimit.Smooth(time.Hour, 5)
	allow(pooled, toSmooth, "pool")
	want(rolling.UseType, "pool", "smooth")
	allow(pooled, rolling, "pool")
	want(rolling.UseType, "pool", "rolling")

	// The column holds what the view shows, for a DBA's own SQL.
	var col *string
	if err := pool.QueryRow(ctx, `SELECT window_kind FROM count_limit WHERE use_type = 'k.classic' AND unique_id = 'c'`).Scan(&col); err != nil {
		t.Fatal(err)
	}
	if col != nil {
		t.Errorf("CheckLimit's row: count_limit.window_kind %q, want NULL", *col)
	}
}
