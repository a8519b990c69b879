package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// schemaText is everything of countlimit's in the current schema that a
// migration may change, as text: tables' and views' columns (name, type,
// nullability, default, comment), indexes, constraints, functions (whole
// definitions and comments), views' definitions and comments.
func schemaText(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
			|| CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
			|| coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
			|| coalesce(' -- ' || col_description(c.oid, a.attnum), '')
		FROM pg_class c
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relname LIKE 'count\_limit%' AND c.relkind IN ('r', 'v')
		UNION ALL
		SELECT 'relation ' || c.relname || ' ' || c.relkind::text || coalesce(' ' || array_to_string(c.reloptions, ','), '')
			|| coalesce(' -- ' || obj_description(c.oid, 'pg_class'), '')
			|| CASE WHEN c.relkind = 'v' THEN E'\n' || pg_get_viewdef(c.oid) ELSE '' END
		FROM pg_class c
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relname LIKE 'count\_limit%'
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
		WHERE c.relnamespace = current_schema()::regnamespace
		UNION ALL
		SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE connamespace = current_schema()::regnamespace
		UNION ALL
		SELECT 'function ' || pg_get_functiondef(p.oid) || coalesce(' -- ' || obj_description(p.oid, 'pg_proc'), '')
		FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		b.WriteString(s)
		b.WriteString("\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestV020MigrationDownIsV010 migrates a database to v0.1.0's schema
// (migration 1), up through 00002_v0_2_0.sql with smooth keys written,
// and down again: the schema is v0.1.0's exactly (columns, comments,
// indexes, functions, the view), the smooth keys' rows read to 00001's
// statements as windows from the epoch to the TAT holding the units
// undrained, which a fixed window joins, and up again the store decides
// smooth checks.
func TestV020MigrationDownIsV010(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testbackend.FreshSchemaURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p := migrator(t, pool)
	if _, err := p.UpTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	v010 := schemaText(t, pool)
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if head := schemaText(t, pool); head == v010 {
		t.Fatal("migration 2 changed nothing that schemaText sees")
	}
	smooth := countlimit.Rule{UseType: "down.smooth", Limit: 10, Window: countlimit.Smooth(10*time.Hour, 5)}
	l := countlimit.New(pgstore.New(pool))
	if r, err := l.AllowN(ctx, smooth, "a", 3); err != nil || !r.Allowed {
		t.Fatalf("AllowN smooth at head: %+v, %v", r, err)
	}
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatalf("down to v0.1.0 (1) with smooth rows: %v", err)
	}
	if got := schemaText(t, pool); got != v010 {
		t.Fatalf("after up and down, the schema is not v0.1.0's:\n%s", lineDiff(v010, got))
	}
	// A fixed window joins the smooth row's window, [epoch, TAT) with its
	// 3 units (00001's fast path, countlimit_allow_one, as a Store in a
	// transaction calls it; the pool's calls need v0.2.0's _pooled
	// statements).
	fixed := countlimit.Rule{UseType: "down.smooth", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if r, err := countlimit.New(pgstore.New(tx)).Allow(ctx, fixed, "a"); err != nil || !r.Allowed || r.Used != 4 {
		t.Fatalf("Allow fixed over a smooth row at v0.1.0's schema: %+v, %v; want allowed, used 4 (the 3 units carried over)", r, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.New(pool).Ping(ctx); err != nil {
		t.Fatalf("Ping after up, down, up: %v", err)
	}
	if r, err := l.AllowN(ctx, smooth, "b", 5); err != nil || !r.Allowed || r.Used != 5 || r.Remaining != 0 {
		t.Fatalf("AllowN smooth after up, down, up: %+v, %v; want allowed, used 5, remaining 0", r, err)
	}
}

// lineDiff lists the lines only one of a and b has.
func lineDiff(a, b string) string {
	as, bs := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range as {
		if !slices.Contains(bs, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bs {
		if !slices.Contains(as, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// smoothStatus is a row of count_limit_status.
type smoothStatus struct {
	kind              string
	used, limit, left int64
	begin, end        pgtype.Timestamptz
	resetsIn          pgtype.Interval
}

func readStatus(t *testing.T, pool *pgxpool.Pool, ut countlimit.UseType, id string) smoothStatus {
	t.Helper()
	var s smoothStatus
	if err := pool.QueryRow(context.Background(), `SELECT window_kind, used, limit_value, remaining, window_begin, window_end, resets_in
		FROM count_limit_status WHERE use_type = $1 AND unique_id = $2`, string(ut), id).
		Scan(&s.kind, &s.used, &s.limit, &s.left, &s.begin, &s.end, &s.resetsIn); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSmoothStatus reads smooth keys in count_limit_status: window_kind
// smooth, used the events not yet drained at now(), remaining the burst
// less used, window_end the TAT, resets_in the time until then; a
// drained key uses 0 and has its whole burst. The rule drains one event
// an hour, so the database's clock, a few milliseconds past the
// Limiter's, drains nothing.
func TestSmoothStatus(t *testing.T) {
	pool := dbaSchema(t, 4, nil)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "status.smooth", Limit: 10, Window: countlimit.Smooth(10*time.Hour, 5), Block: time.Minute}
	l := countlimit.New(pgstore.New(pool))
	r, err := l.AllowN(ctx, rule, "a", 3)
	if err != nil || !r.Allowed || r.Used != 3 || r.Remaining != 2 {
		t.Fatalf("AllowN 3 = %+v, %v; want allowed, used 3, remaining 2", r, err)
	}
	s := readStatus(t, pool, rule.UseType, "a")
	if s.kind != "smooth" || s.used != 3 || s.left != 2 || s.limit != 10 || s.begin.Valid || !s.end.Valid || !s.end.Time.Equal(r.ResetAt) {
		t.Errorf("status after 3 of a burst of 5 = %+v, want smooth, used 3, remaining 2, limit 10, no begin, end %v", s, r.ResetAt)
	}
	if d := time.Duration(s.resetsIn.Microseconds) * time.Microsecond; !s.resetsIn.Valid || d <= 2*time.Hour || d > 3*time.Hour {
		t.Errorf("resets_in = %v (%v), want within (2h, 3h]", d, s.resetsIn.Valid)
	}
	// A denial: the penalty shows, the smooth state stays.
	if r, err := l.AllowN(ctx, rule, "a", 3); err != nil || r.Allowed {
		t.Fatalf("AllowN 3 more = %+v, %v; want denied", r, err)
	}
	var blocked bool
	var denied int64
	if err := pool.QueryRow(ctx, `SELECT blocked, denied_count FROM count_limit_status WHERE use_type = $1 AND unique_id = 'a'`,
		string(rule.UseType)).Scan(&blocked, &denied); err != nil || !blocked || denied != 1 {
		t.Errorf("after a denial: blocked %v, denied %d, %v; want blocked, 1 denial", blocked, denied, err)
	}
	if s := readStatus(t, pool, rule.UseType, "a"); s.kind != "smooth" || s.used != 3 {
		t.Errorf("status after a denial = %+v, want smooth, used 3", s)
	}
	// A drained key: a Limiter whose clock is 10 hours behind wrote it.
	past := countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return time.Now().Add(-10 * time.Hour) }))
	if r, err := past.AllowN(ctx, rule, "drained", 4); err != nil || !r.Allowed {
		t.Fatalf("AllowN 4 ten hours ago = %+v, %v", r, err)
	}
	if s := readStatus(t, pool, rule.UseType, "drained"); s.kind != "smooth" || s.used != 0 || s.left != 5 || s.end.Valid || s.resetsIn.Valid {
		t.Errorf("status of a drained key = %+v, want smooth, used 0, remaining 5, no end, no resets_in", s)
	}
	// countlimit_most_denied lists it as the view has it.
	var kind string
	var used int64
	if err := pool.QueryRow(ctx, `SELECT window_kind, used FROM countlimit_most_denied() WHERE use_type = $1`, string(rule.UseType)).
		Scan(&kind, &used); err != nil || kind != "smooth" || used != 3 {
		t.Errorf("countlimit_most_denied: %s, used %d, %v; want smooth, used 3", kind, used, err)
	}
	// countlimit_lift_penalty ends the penalty and keeps the instant.
	var lifted int64
	if err := pool.QueryRow(ctx, `SELECT countlimit_lift_penalty('a', $1)`, string(rule.UseType)).Scan(&lifted); err != nil || lifted != 1 {
		t.Fatalf("countlimit_lift_penalty = %d, %v; want 1", lifted, err)
	}
	if r, err := l.AllowN(ctx, rule, "a", 2); err != nil || !r.Allowed || r.Used != 5 {
		t.Errorf("AllowN 2 after the penalty was lifted = %+v, %v; want allowed, used 5 (the instant kept)", r, err)
	}
	// countlimit_reset_id forgets it.
	if _, err := pool.Exec(ctx, `SELECT countlimit_reset_id('a')`); err != nil {
		t.Fatal(err)
	}
	if r, err := l.AllowN(ctx, rule, "a", 5); err != nil || !r.Allowed {
		t.Errorf("AllowN 5 after countlimit_reset_id = %+v, %v; want allowed (a fresh key)", r, err)
	}
	// A fixed rule of the same use type joins the smooth key's window,
	// [epoch, TAT): the view shows its count until the TAT, and no begin.
	fixed := countlimit.Rule{UseType: rule.UseType, Limit: 10, Window: countlimit.Fixed(time.Hour)}
	r, err = l.Allow(ctx, fixed, "a")
	if err != nil || !r.Allowed || r.Used != 6 {
		t.Fatalf("Allow fixed over 5 undrained = %+v, %v; want allowed, used 6", r, err)
	}
	if s := readStatus(t, pool, rule.UseType, "a"); s.kind != "fixed" || s.used != 6 || s.left != 4 || s.begin.Valid || !s.end.Valid || !s.end.Time.Equal(r.ResetAt) {
		t.Errorf("status of a fixed window joined from a smooth key = %+v, want fixed, used 6, remaining 4, no begin, end %v", s, r.ResetAt)
	}
}

// TestSmoothAdjustCount holds countlimit_adjust_count on a smooth key: a
// delta moves its TAT by delta intervals, never before now() and never
// past a full burst, and it returns the new used; a drained key takes a
// positive delta; a smooth row with no interval recorded is refused.
func TestSmoothAdjustCount(t *testing.T) {
	pool := dbaSchema(t, 4, nil)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "adjust.smooth", Limit: 10, Window: countlimit.Smooth(10*time.Hour, 5)}
	l := countlimit.New(pgstore.New(pool))
	if r, err := l.AllowN(ctx, rule, "a", 2); err != nil || !r.Allowed {
		t.Fatalf("AllowN 2 = %+v, %v", r, err)
	}
	adjust := func(id string, delta int64) (n pgtype.Int8) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT countlimit_adjust_count($1, $2, $3)`, id, string(rule.UseType), delta).Scan(&n); err != nil {
			t.Fatalf("countlimit_adjust_count(%s, %d): %v", id, delta, err)
		}
		return n
	}
	for _, step := range []struct {
		delta, want int64
	}{
		{1, 3},   // 2 undrained, plus 1
		{-1, 2},  // back
		{10, 5},  // no further than a full burst
		{-10, 0}, // no earlier than now: drained
		{-1, 0},  // a drained key stays drained
		{4, 4},   // a drained key takes a positive delta
	} {
		if got := adjust("a", step.delta); !got.Valid || got.Int64 != step.want {
			t.Errorf("adjust by %d = %v, want %d", step.delta, got, step.want)
		}
		if s := readStatus(t, pool, rule.UseType, "a"); s.used != step.want || s.left != 5-step.want {
			t.Errorf("after adjusting by %d: status used %d, remaining %d; want %d, %d", step.delta, s.used, s.left, step.want, 5-step.want)
		}
		// The row's count follows, as a smooth check writes it: what a
		// rule of another kind carries over.
		if k, err := readKey(ctx, pool, string(rule.UseType), "a"); err != nil || k.Count != step.want || k.Begin != 0 {
			t.Errorf("after adjusting by %d: the row keeps count %d from %d (%v); want %d from the epoch", step.delta, k.Count, k.Begin, err, step.want)
		}
	}
	// The checks see the adjusted instant: 4 undrained, one more fits.
	if r, err := l.AllowN(ctx, rule, "a", 2); err != nil || r.Allowed {
		t.Errorf("AllowN 2 after adjusting to 4 of 5 = %+v, %v; want denied", r, err)
	}
	if r, err := l.Allow(ctx, rule, "a"); err != nil || !r.Allowed || r.Used != 5 {
		t.Errorf("Allow after adjusting to 4 of 5 = %+v, %v; want allowed, used 5", r, err)
	}
	// A smooth row with no interval recorded (a hand-made one).
	if _, err := pool.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, window_kind)
		VALUES ($1, 'bare', now() + interval '1 hour', now() + interval '1 hour', 'smooth')`, string(rule.UseType)); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `SELECT countlimit_adjust_count('bare', $1, 1)`, string(rule.UseType))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" || !strings.Contains(pgErr.Message, "no interval or burst recorded") {
		t.Errorf("countlimit_adjust_count on a smooth row with no interval: %v, want feature_not_supported naming the missing interval", err)
	}
}

// TestSmoothConcurrentAllows sends many Allows of one smooth key at once,
// from many goroutines over a pool, at one instant of the Limiter's clock:
// exactly the burst is allowed, whatever the interleaving, and the
// Results agree with one another.
func TestSmoothConcurrentAllows(t *testing.T) {
	pool := dbaSchema(t, 8, nil)
	ctx := context.Background()
	at := time.Now()
	l := countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return at }))
	const burst, callers = 17, 64
	rule := countlimit.Rule{UseType: "race.smooth", Limit: 5, Window: countlimit.Smooth(time.Hour, burst)}
	other := countlimit.Rule{UseType: "race.fixed", Limit: 1000, Window: countlimit.Fixed(time.Hour)}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	used := make([]bool, burst+1)
	var mu sync.Mutex
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r countlimit.Result
			var err error
			if i%2 == 0 {
				r, err = l.Allow(ctx, rule, "hot")
			} else {
				// AllowAll takes the same row with another beside it.
				var rs []countlimit.Result
				rs, err = l.AllowAll(ctx, "hot", rule, other)
				if err == nil {
					r = rs[0]
				}
			}
			if err != nil {
				errs <- err
				return
			}
			if r.Allowed {
				allowed.Add(1)
				mu.Lock()
				defer mu.Unlock()
				if r.Used < 1 || r.Used > burst || used[r.Used] {
					errs <- fmt.Errorf("an allowed call got used %d, out of 1..%d or taken twice", r.Used, burst)
					return
				}
				used[r.Used] = true
			} else if r.Used != burst || r.RetryAfter <= 0 {
				errs <- fmt.Errorf("a denied call got %+v, want used %d and a wait", r, burst)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := allowed.Load(); n != burst {
		t.Errorf("%d of %d calls allowed at one instant, want the burst, %d", n, callers, burst)
	}
}

// TestSmoothPurge: the purge deletes a drained smooth key (its TAT, in
// end_time, has passed; no penalty) as it deletes an ended window, and
// keeps one that is not drained, and one drained but blocked.
func TestSmoothPurge(t *testing.T) {
	pool := dbaSchema(t, 4, nil)
	ctx := context.Background()
	now := time.Now()
	at := func(d time.Duration) *countlimit.Limiter {
		return countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return now.Add(d) }))
	}
	rule := countlimit.Rule{UseType: "purge.smooth", Limit: 1, Window: countlimit.Smooth(time.Minute, 2), Block: time.Hour}
	if r, err := at(-time.Hour).AllowN(ctx, rule, "drained", 2); err != nil || !r.Allowed {
		t.Fatalf("AllowN an hour ago: %+v, %v", r, err)
	}
	if r, err := at(0).AllowN(ctx, rule, "live", 2); err != nil || !r.Allowed {
		t.Fatalf("AllowN now: %+v, %v", r, err)
	}
	// Denied an hour less a minute ago, after its burst: blocked until an
	// hour later, drained long before.
	if r, err := at(-time.Hour+time.Minute).AllowN(ctx, rule, "blocked", 2); err != nil || !r.Allowed {
		t.Fatalf("AllowN: %+v, %v", r, err)
	}
	if r, err := at(-time.Hour+time.Minute).Allow(ctx, rule, "blocked"); err != nil || r.Allowed {
		t.Fatalf("Allow past the burst: %+v, %v; want denied", r, err)
	}
	n, err := pgstore.New(pool).Purge(ctx, now, 100)
	if err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v; want 1 (the drained key)", n, err)
	}
	var left []string
	rows, err := pool.Query(ctx, `SELECT unique_id FROM count_limit WHERE use_type = $1 ORDER BY 1`, string(rule.UseType))
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(left) != "[blocked live]" {
		t.Errorf("after the purge: %v, want [blocked live]", left)
	}
}

// TestV010StatementsOnSmoothRows runs v0.1.0's statements, as a v0.1.0
// binary still running during a rolling upgrade sends them (its
// countlimit_apply without intervals and bursts, its fast path), on a
// migrated database whose smooth keys a newer binary wrote: a fixed window
// joins a smooth row's window and counts on its units (the TAT goes), as
// model.Apply does; a sliding refund sets the count to 0, as v0.1.0
// resets a count it does not know, and leaves the TAT; a denial leaves
// both; and v0.1.0's Ping query still finds its schema.
func TestV010StatementsOnSmoothRows(t *testing.T) {
	pool := dbaSchema(t, 4, nil)
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	l := countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return now }))
	smooth := countlimit.Rule{UseType: "v010.smooth", Limit: 10, Window: countlimit.Smooth(10*time.Hour, 5)}
	for _, id := range []string{"fixed", "refund", "denied"} {
		if r, err := l.AllowN(ctx, smooth, id, 3); err != nil || !r.Allowed {
			t.Fatalf("AllowN smooth %s: %+v, %v", id, r, err)
		}
	}
	tat := now.Add(3 * time.Hour).UnixMicro()
	var ready bool
	if err := pool.QueryRow(ctx, `SELECT to_regprocedure('countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[])') IS NOT NULL`).
		Scan(&ready); err != nil || !ready {
		t.Fatalf("v0.1.0's SchemaReady finds its countlimit_apply: %v, %v", ready, err)
	}
	// v0.1.0's countlimit_apply, as its pgstore called it.
	apply := func(op, id string, n int64, limit int64, begin time.Time, length, span int64, kind string) {
		t.Helper()
		var b *time.Time
		if !begin.IsZero() {
			b = &begin
		}
		if _, err := pool.Exec(ctx, `SELECT * FROM countlimit_apply($1::text, $2::text, $3::timestamptz, $4::bigint, $5::text[],
			$6::bigint[], $7::timestamptz[], $8::bigint[], $9::bigint[], $10::bigint[], $11::text[])`,
			op, id, now, n, []string{string(smooth.UseType)}, []int64{limit}, []*time.Time{b}, []int64{length}, []int64{span}, []int64{0}, []string{kind}); err != nil {
			t.Fatalf("v0.1.0's countlimit_apply %s %s: %v", op, id, err)
		}
	}
	// An AllowAll's fixed window (through countlimit_apply) over a smooth row.
	apply("allow", "fixed", 1, 5, now, time.Hour.Microseconds(), 0, "fixed")
	// A sliding refund: no log to give back from; v0.1.0 writes its empty
	// log's count, 0, and the TAT stays.
	apply("refund", "refund", 1, 5, time.Time{}, 0, time.Hour.Microseconds(), "sliding")
	// v0.1.0's fast path denies a fixed window of limit 0 there: a tally.
	var allowed bool
	if err := pool.QueryRow(ctx, `SELECT o_allowed FROM countlimit_allow_one($1, 'denied', $2, 1, 0, $2, $3, NULL, true, 'fixed')`,
		string(smooth.UseType), now, now.Add(time.Hour)).Scan(&allowed); err != nil || allowed {
		t.Fatalf("v0.1.0's countlimit_allow_one, limit 0: allowed %v, %v; want denied", allowed, err)
	}
	for _, c := range []struct {
		id   string
		want string
	}{
		{"fixed", fmt.Sprintf("count 4 [0, %d) tat 0 denied 0", tat)},
		{"refund", fmt.Sprintf("count 0 [0, %d) tat %d denied 0", tat, tat)},
		{"denied", fmt.Sprintf("count 3 [0, %d) tat %d denied 1", tat, tat)},
	} {
		k, err := readKey(ctx, pool, string(smooth.UseType), c.id)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("count %d tat %d denied %d", k.Count, k.TAT, k.Denied)
		if k.Begin < k.End {
			got = fmt.Sprintf("count %d [%d, %d) tat %d denied %d", k.Count, k.Begin, k.End, k.TAT, k.Denied)
		}
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.id, got, c.want)
		}
	}
	// The newer binary then decides on those rows as the model does: the
	// fixed window's row is no smooth key any more, its 4 carried over as
	// 4 units taken; the others keep their TAT, 3 of 5.
	for _, c := range []struct {
		id   string
		used int64
	}{{"fixed", 5}, {"refund", 4}, {"denied", 4}} {
		if r, err := l.Allow(ctx, smooth, c.id); err != nil || !r.Allowed || r.Used != c.used {
			t.Errorf("Allow smooth %s after v0.1.0's statements: %+v, %v; want allowed, used %d", c.id, r, err, c.used)
		}
	}
}
