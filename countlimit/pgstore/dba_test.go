package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// The DBA functions of the migrations, as docs/operations.md
// calls them.
var dbaFunctions = []string{
	"countlimit_reset_id(text, text)",
	"countlimit_lift_penalty(text, text)",
	"countlimit_adjust_count(text, text, bigint)",
	"countlimit_most_denied(interval, integer)",
}

// dbaSchemaNotices is dbaSchema whose connections keep the notices the
// server sends; lastNotice returns the latest since its last call, or "",
// and forgets them.
func dbaSchemaNotices(t testing.TB, maxConns int32) (pool *pgxpool.Pool, lastNotice func() string) {
	t.Helper()
	var (
		mu      sync.Mutex
		notices []string
	)
	pool = dbaSchema(t, maxConns, func(n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	})
	return pool, func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(notices) == 0 {
			return ""
		}
		s := notices[len(notices)-1]
		notices = nil
		return s
	}
}

// dbaSchema returns a pool of maxConns connections on a fresh, migrated
// schema, whose notices (the functions' and auto_explain's) go to notices
// when it is not nil, and which runs each of setup's statements on every
// new connection.
func dbaSchema(t testing.TB, maxConns int32, notices func(*pgconn.Notice), setup ...string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testbackend.FreshSchemaURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	if notices != nil {
		cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices(n) }
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		for _, sql := range setup {
			if _, err := c.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// dbaRow is a count_limit row as a DBA sees it.
type dbaRow struct {
	count, denied int64
	blockedUntil  *time.Time
	updatedAt     time.Time
}

func (r dbaRow) same(o dbaRow) bool {
	return r.count == o.count && r.denied == o.denied && r.updatedAt.Equal(o.updatedAt) &&
		(r.blockedUntil == nil) == (o.blockedUntil == nil) && (r.blockedUntil == nil || r.blockedUntil.Equal(*o.blockedUntil))
}

// readRow returns the row of (ut, id), or ok false when there is none.
func readRow(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, ut countlimit.UseType, id string) (r dbaRow, ok bool) {
	t.Helper()
	err := q.QueryRow(context.Background(), `SELECT already_count, denied_count, blocked_until, updated_at
		FROM count_limit WHERE use_type = $1 AND unique_id = $2`, string(ut), id).
		Scan(&r.count, &r.denied, &r.blockedUntil, &r.updatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

// call runs one DBA function call that returns one bigint, NULL as nil.
func call(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) *int64 {
	t.Helper()
	var n *int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s %v: %v", sql, args, err)
	}
	return n
}

func i64(p *int64) string {
	if p == nil {
		return "NULL"
	}
	return fmt.Sprint(*p)
}

func TestDBAResetID(t *testing.T) {
	pool := dbaSchema(t, 4, nil)
	ctx := context.Background()
	l := countlimit.New(pgstore.New(pool))
	sms := countlimit.Rule{UseType: "dba.sms", Limit: 2, Window: countlimit.Rolling(time.Hour), Block: time.Hour}
	pw := countlimit.Rule{UseType: "dba.pw", Limit: 5, Window: countlimit.Lifetime()}
	slots := countlimit.Rule{UseType: "dba.slots", Limit: 1, Window: countlimit.Concurrent(time.Hour)}
	for _, id := range []string{"u1", "u2"} {
		for range 3 {
			if _, err := l.Allow(ctx, sms, id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Allow(ctx, pw, id); err != nil {
			t.Fatal(err)
		}
	}
	lease, res, err := l.Acquire(ctx, slots, "u1")
	if err != nil || !res.Allowed {
		t.Fatalf("Acquire = %+v, %v", res, err)
	}

	// One use type: its row goes, penalty and tally with it.
	if n := call(t, pool, `SELECT countlimit_reset_id($1, $2)`, "u1", "dba.sms"); i64(n) != "1" {
		t.Errorf("countlimit_reset_id(u1, dba.sms) = %s, want 1", i64(n))
	}
	if _, ok := readRow(t, pool, sms.UseType, "u1"); ok {
		t.Error("the row of (dba.sms, u1) is still there after its reset")
	}
	if r, err := l.Allow(ctx, sms, "u1"); err != nil || !r.Allowed || r.Used != 1 {
		t.Errorf("Allow after the reset = %+v, %v; want allowed, Used 1", r, err)
	}
	if r, ok := readRow(t, pool, sms.UseType, "u1"); !ok || r.denied != 0 || r.blockedUntil != nil {
		t.Errorf("row after the reset and one Allow: %+v (present %v); want tally 0, no penalty", r, ok)
	}
	if r, ok := readRow(t, pool, pw.UseType, "u1"); !ok || r.count != 1 {
		t.Errorf("(dba.pw, u1) after resetting dba.sms only: %+v (present %v); want untouched", r, ok)
	}

	// Every use type, leases included.
	if n := call(t, pool, `SELECT countlimit_reset_id('u1')`); i64(n) != "3" {
		t.Errorf("countlimit_reset_id('u1') = %s, want 3 (sms, pw, slots)", i64(n))
	}
	var left, leases int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM count_limit WHERE unique_id = 'u1'),
		(SELECT count(*) FROM count_limit_lease WHERE unique_id = 'u1')`).Scan(&left, &leases); err != nil {
		t.Fatal(err)
	}
	if left != 0 || leases != 0 {
		t.Errorf("after countlimit_reset_id('u1'): %d rows and %d leases left, want none", left, leases)
	}
	if err := lease.Extend(ctx); !errors.Is(err, countlimit.ErrLeaseExpired) {
		t.Errorf("Extend of a lease reset away: %v, want ErrLeaseExpired", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("Release of a lease reset away: %v, want nil (nothing to free)", err)
	}
	if _, r, err := l.Acquire(ctx, slots, "u1"); err != nil || !r.Allowed {
		t.Errorf("Acquire after the reset = %+v, %v; want the slot", r, err)
	}
	for _, ut := range []countlimit.UseType{sms.UseType, pw.UseType} {
		if r, ok := readRow(t, pool, ut, "u2"); !ok || r.count == 0 {
			t.Errorf("(%s, u2) after resetting u1: %+v (present %v); want untouched", ut, r, ok)
		}
	}

	if n := call(t, pool, `SELECT countlimit_reset_id('nobody')`); i64(n) != "0" {
		t.Errorf("countlimit_reset_id('nobody') = %s, want 0", i64(n))
	}
	if _, err := pool.Exec(ctx, `SELECT countlimit_reset_id(NULL)`); err == nil || !strings.Contains(err.Error(), "unique_id is NULL") {
		t.Errorf("countlimit_reset_id(NULL): err = %v, want one saying unique_id is NULL", err)
	}
}

func TestDBALiftPenalty(t *testing.T) {
	pool := dbaSchema(t, 4, nil)
	ctx := context.Background()
	l := countlimit.New(pgstore.New(pool))
	pw := countlimit.Rule{UseType: "dba.pw", Limit: 2, Window: countlimit.Rolling(time.Hour), Block: time.Hour}
	sms := countlimit.Rule{UseType: "dba.sms", Limit: 0, Window: countlimit.Rolling(time.Hour), Block: time.Hour}
	steps := []struct {
		rule    countlimit.Rule
		allowed bool
	}{{pw, true}, {pw, true}, {pw, false}, {pw, false}, {sms, false}}
	for i, s := range steps {
		if r, err := l.Allow(ctx, s.rule, "u1"); err != nil || r.Allowed != s.allowed {
			t.Fatalf("step %d: Allow(%s) = %+v, %v; want allowed %v", i, s.rule.UseType, r, err, s.allowed)
		}
	}
	before, _ := readRow(t, pool, pw.UseType, "u1")
	if before.blockedUntil == nil || before.count != 2 || before.denied != 2 {
		t.Fatalf("before the lift: %+v; want count 2, tally 2, blocked", before)
	}

	if n := call(t, pool, `SELECT countlimit_lift_penalty('u1', 'dba.pw')`); i64(n) != "1" {
		t.Errorf("countlimit_lift_penalty('u1', 'dba.pw') = %s, want 1", i64(n))
	}
	after, _ := readRow(t, pool, pw.UseType, "u1")
	if after.blockedUntil != nil || after.count != 2 || after.denied != 2 {
		t.Errorf("after the lift: %+v; want no penalty, count 2 and tally 2 kept", after)
	}
	if r, _ := readRow(t, pool, sms.UseType, "u1"); r.blockedUntil == nil {
		t.Error("lifting dba.pw lifted dba.sms's penalty too")
	}
	// The window is still full: the next check is denied, and blocked again.
	if r, err := l.Allow(ctx, pw, "u1"); err != nil || r.Allowed || r.BlockedUntil.IsZero() {
		t.Errorf("Allow after the lift, window full = %+v, %v; want denied and blocked again", r, err)
	}
	// Lowered and lifted: the next check is allowed.
	if n := call(t, pool, `SELECT countlimit_adjust_count('u1', 'dba.pw', -1)`); i64(n) != "1" {
		t.Errorf("countlimit_adjust_count(-1) = %s, want 1", i64(n))
	}
	if r, err := l.Allow(ctx, pw, "u1"); err != nil || r.Allowed {
		t.Errorf("Allow lowered but still blocked = %+v, %v; want denied (lowering lifts no penalty)", r, err)
	}
	if n := call(t, pool, `SELECT countlimit_lift_penalty('u1')`); i64(n) != "2" {
		t.Errorf("countlimit_lift_penalty('u1') = %s, want 2 (pw and sms)", i64(n))
	}
	if r, err := l.Allow(ctx, pw, "u1"); err != nil || !r.Allowed || r.Used != 2 {
		t.Errorf("Allow lowered and lifted = %+v, %v; want allowed, Used 2", r, err)
	}
	if r, _ := readRow(t, pool, pw.UseType, "u1"); r.denied != 4 {
		t.Errorf("tally of dba.pw = %d, want 4: lifts and adjustments keep it", r.denied)
	}
	if n := call(t, pool, `SELECT countlimit_lift_penalty('u1')`); i64(n) != "0" {
		t.Errorf("countlimit_lift_penalty of an id no longer blocked = %s, want 0", i64(n))
	}
	if n := call(t, pool, `SELECT countlimit_lift_penalty('nobody', 'dba.pw')`); i64(n) != "0" {
		t.Errorf("countlimit_lift_penalty('nobody') = %s, want 0", i64(n))
	}
}

func TestDBAAdjustCount(t *testing.T) {
	pool, lastNotice := dbaSchemaNotices(t, 4)
	ctx := context.Background()
	l := countlimit.New(pgstore.New(pool))
	rule := countlimit.Rule{UseType: "dba.sms", Limit: 5, Window: countlimit.Rolling(time.Hour)}
	adjust := func(id string, ut countlimit.UseType, delta int64) *int64 {
		t.Helper()
		return call(t, pool, `SELECT countlimit_adjust_count($1, $2, $3)`, id, string(ut), delta)
	}
	if _, err := l.AllowN(ctx, rule, "u1", 3); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		delta   int64
		want    string
		allowN  int64 // the next check's n
		allowed bool
		used    int64
	}{
		{+2, "5", 1, false, 5},  // raised to the limit: denied
		{+4, "9", 1, false, 9},  // past it: kept, denied
		{-8, "1", 4, true, 5},   // lowered: 4 fit
		{-100, "0", 5, true, 5}, // never below 0
		{-1, "4", 2, false, 4},  // 2 do not fit in 1
		{0, "4", 1, true, 5},    // nothing changes
		{-5, "0", 6, false, 0},  // n over the limit never fits
		{+1, "1", 1, true, 2},   // raised from 0
	}
	for i, s := range steps {
		if n := adjust("u1", rule.UseType, s.delta); i64(n) != s.want {
			t.Fatalf("step %d: countlimit_adjust_count(%+d) = %s, want %s", i, s.delta, i64(n), s.want)
		}
		r, err := l.AllowN(ctx, rule, "u1", s.allowN)
		if err != nil || r.Allowed != s.allowed || r.Used != s.used {
			t.Fatalf("step %d: after adjusting by %+d, AllowN(%d) = allowed %v Used %d, %v; want %v, %d",
				i, s.delta, s.allowN, r.Allowed, r.Used, err, s.allowed, s.used)
		}
	}
	row, _ := readRow(t, pool, rule.UseType, "u1")
	if row.denied != 4 {
		t.Errorf("tally after the steps = %d, want 4 (the denied steps): adjusting leaves it", row.denied)
	}

	// A lifetime window is always current.
	forever := countlimit.Rule{UseType: "dba.forever", Limit: 3, Window: countlimit.Lifetime()}
	if _, err := l.Allow(ctx, forever, "u1"); err != nil {
		t.Fatal(err)
	}
	if n := adjust("u1", forever.UseType, +2); i64(n) != "3" {
		t.Errorf("adjusting a lifetime count by +2 = %s, want 3", i64(n))
	}
	if r, err := l.Allow(ctx, forever, "u1"); err != nil || r.Allowed {
		t.Errorf("Allow of a lifetime limit raised to full = %+v, %v; want denied", r, err)
	}

	// No current window: nothing to change, NULL and a notice.
	past := countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }))
	if _, err := past.AllowN(ctx, rule, "stale", 4); err != nil {
		t.Fatal(err)
	}
	zero := countlimit.Rule{UseType: "dba.zero", Limit: 0, Window: countlimit.Rolling(time.Hour)}
	if _, err := l.Allow(ctx, zero, "denied-only"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id     string
		ut     countlimit.UseType
		notice string
	}{
		{"stale", rule.UseType, "has no current window"},
		{"denied-only", zero.UseType, "has no current window"},
		{"nobody", rule.UseType, "no row"},
	} {
		before, had := readRow(t, pool, c.ut, c.id)
		if n := adjust(c.id, c.ut, +3); n != nil {
			t.Errorf("adjusting %s = %d, want NULL", c.id, *n)
		}
		if got := lastNotice(); !strings.Contains(got, c.notice) {
			t.Errorf("adjusting %s: notice %q, want one saying %q", c.id, got, c.notice)
		}
		if after, has := readRow(t, pool, c.ut, c.id); had != has || !after.same(before) {
			t.Errorf("adjusting %s wrote %+v over %+v", c.id, after, before)
		}
	}
	if r, err := l.AllowN(ctx, rule, "stale", 5); err != nil || !r.Allowed || r.Used != 5 {
		t.Errorf("AllowN(5) after the stale window = %+v, %v; want a new window, Used 5", r, err)
	}

	// A sliding window has no single count.
	sliding := countlimit.Rule{UseType: "dba.sliding", Limit: 5, Window: countlimit.Sliding(time.Hour)}
	if _, err := l.AllowN(ctx, sliding, "u1", 2); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	_, err := pool.Exec(ctx, `SELECT countlimit_adjust_count('u1', 'dba.sliding', -1)`)
	if !errors.As(err, &pgErr) || pgErr.Code != "0A000" || !strings.Contains(pgErr.Message, "sliding") || !strings.Contains(pgErr.Message, "events") {
		t.Errorf("adjusting a sliding window: err = %v, want SQLSTATE 0A000 naming the sliding window and its events", err)
	}
	if r, err := l.Peek(ctx, sliding, "u1"); err != nil || r.Used != 2 {
		t.Errorf("Peek of the sliding window after the refusal = %+v, %v; want Used 2", r, err)
	}

	for _, sql := range []string{
		`SELECT countlimit_adjust_count('u1', 'dba.sms', NULL)`,
		`SELECT countlimit_adjust_count('u1', NULL, 1)`,
		`SELECT countlimit_adjust_count(NULL, 'dba.sms', 1)`,
	} {
		if _, err := pool.Exec(ctx, sql); !errors.As(err, &pgErr) || pgErr.Code != "22004" {
			t.Errorf("%s: err = %v, want SQLSTATE 22004", sql, err)
		}
	}
}

func TestDBAMostDenied(t *testing.T) {
	pool := dbaSchema(t, 4, nil)
	ctx := context.Background()
	l := countlimit.New(pgstore.New(pool))
	rule := countlimit.Rule{UseType: "dba.sms", Limit: 1, Window: countlimit.Rolling(time.Hour)}
	pw := countlimit.Rule{UseType: "dba.pw", Limit: 1, Window: countlimit.Rolling(time.Hour)}
	for id, checks := range map[string]int{"none": 1, "few": 3, "many": 6, "old": 9} {
		for range checks {
			if _, err := l.Allow(ctx, rule, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 3 {
		if _, err := l.Allow(ctx, pw, "many"); err != nil {
			t.Fatal(err)
		}
	}
	// Written two hours ago, as far as the table can tell.
	if _, err := pool.Exec(ctx, `UPDATE count_limit SET updated_at = now() - interval '2 hours' WHERE unique_id = 'old'`); err != nil {
		t.Fatal(err)
	}
	list := func(sql string) string {
		t.Helper()
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var ut, id string
			var denied int64
			err := r.Scan(&ut, &id, &denied)
			return fmt.Sprintf("%s/%s:%d", ut, id, denied), err
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(got, " ")
	}
	for _, c := range []struct{ sql, want string }{
		{`SELECT use_type, unique_id, denied_count FROM countlimit_most_denied()`,
			"dba.sms/many:5 dba.pw/many:2 dba.sms/few:2"},
		{`SELECT use_type, unique_id, denied_count FROM countlimit_most_denied(max_rows => 1)`,
			"dba.sms/many:5"},
		{`SELECT use_type, unique_id, denied_count FROM countlimit_most_denied(interval '3 hours')`,
			"dba.sms/old:8 dba.sms/many:5 dba.pw/many:2 dba.sms/few:2"},
		{`SELECT unique_id, unique_id, sum(denied_count)::bigint FROM countlimit_most_denied(interval '1 day', NULL) GROUP BY 1 ORDER BY 3 DESC`,
			"old/old:8 many/many:7 few/few:2"},
	} {
		if got := list(c.sql); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.sql, got, c.want)
		}
	}
	// What it cannot tell: a row denied long ago and allowed lately is
	// listed with its old denials.
	if _, err := pool.Exec(ctx, `SELECT countlimit_reset_id('old')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, updated_at)
		VALUES ('dba.sms', 'old', 0, now(), now() + interval '1 hour', 1, 8, now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx, rule, "old"); err != nil || !r.Allowed {
		t.Fatalf("Allow = %+v, %v", r, err)
	}
	if got := list(`SELECT use_type, unique_id, denied_count FROM countlimit_most_denied(max_rows => 1)`); got != "dba.sms/old:8" {
		t.Errorf("after an old row's one allowed check, the top row is %s, want dba.sms/old:8 (its tally is since creation)", got)
	}
}

// TestDBAFunctionsResolve checks that each DBA function is the only one of
// its name, so a call with untyped literals, as docs/operations.md shows
// them, resolves to it, and that each is commented for \df+; and that the
// store's own countlimit_reset(text, text[]) is still alone of its name.
func TestDBAFunctionsResolve(t *testing.T) {
	pool := dbaSchema(t, 2, nil)
	ctx := context.Background()
	for _, f := range append(slices.Clone(dbaFunctions), "countlimit_reset(text, text[])") {
		name, _, _ := strings.Cut(f, "(")
		var overloads int
		var comment *string
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_proc WHERE proname = $1 AND pronamespace = current_schema()::regnamespace),
			obj_description(to_regprocedure($2), 'pg_proc')`, name, f).Scan(&overloads, &comment)
		if err != nil {
			t.Fatal(err)
		}
		if overloads != 1 {
			t.Errorf("%s: %d functions of that name, want 1 (a call with untyped literals could reach another)", name, overloads)
		}
		if name != "countlimit_reset" && (comment == nil || *comment == "") {
			t.Errorf("%s: no COMMENT ON FUNCTION", f)
		}
	}
	for _, sql := range []string{
		`SELECT countlimit_reset_id('u')`,
		`SELECT countlimit_reset_id('u', 'x')`,
		`SELECT countlimit_reset_id(unique_id => 'u', use_type => 'x')`,
		`SELECT countlimit_lift_penalty('u')`,
		`SELECT countlimit_lift_penalty('u', 'x')`,
		`SELECT countlimit_adjust_count('u', 'x', 1)`,
		`SELECT countlimit_adjust_count('u', 'x', -1)`,
		`SELECT countlimit_adjust_count(unique_id => 'u', use_type => 'x', delta => -1)`,
		`SELECT * FROM countlimit_most_denied()`,
		`SELECT * FROM countlimit_most_denied(interval '1 day')`,
		`SELECT * FROM countlimit_most_denied('1 day', 5)`,
		`SELECT * FROM countlimit_most_denied(written_within => '10 minutes', max_rows => NULL)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Errorf("%s: %v", sql, err)
		}
	}
	// The store's Reset with an untyped array literal still reaches it (an
	// overload taking text would be preferred for it).
	rows, err := pool.Query(ctx, `EXPLAIN (VERBOSE, COSTS OFF) SELECT countlimit_reset('u', '{x}')`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if plan := strings.Join(lines, "\n"); !strings.Contains(plan, `'{x}'::text[]`) {
		t.Errorf("countlimit_reset('u', '{x}') resolves as %q, want its second argument a text[]", plan)
	}
}

// dbaSection returns the SQL blocks of docs/operations.md's "SQL for DBAs".
func dbaSection(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## SQL for DBAs\n")
	if !ok {
		t.Fatal(`docs/operations.md has no "## SQL for DBAs" section`)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// TestDBADocSQL runs every SQL block of docs/operations.md's "SQL for DBAs"
// in order, in one session, each on the same ids in the same state (the
// ones the document names), so that the document cannot drift from the
// schema: a call that does not resolve or a column that does not exist
// fails here. Every DBA function must be shown.
func TestDBADocSQL(t *testing.T) {
	pool := dbaSchema(t, 2, nil)
	ctx := context.Background()
	blocks := dbaSection(t)
	all := strings.Join(blocks, "\n")
	for _, f := range dbaFunctions {
		name, _, _ := strings.Cut(f, "(")
		if !strings.Contains(all, name+"(") {
			t.Errorf("docs/operations.md, SQL for DBAs: no SQL block calls %s", name)
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	l := countlimit.New(pgstore.New(conn.Conn()))
	rules := []countlimit.Rule{
		{UseType: "sms.code", Limit: 5, Window: countlimit.Rolling(5 * time.Minute)},
		{UseType: "password.change", Limit: 3, Window: countlimit.Rolling(24 * time.Hour), Block: 30 * time.Minute},
	}
	for i, b := range blocks {
		// The state the document speaks of: user-42 has sent SMS codes and
		// is blocked from changing passwords; others were denied too.
		if _, err := conn.Exec(ctx, `DELETE FROM count_limit`); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"user-42", "user-7"} {
			for _, r := range rules {
				for range 4 {
					if _, err := l.Allow(ctx, r, id); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if _, err := conn.Exec(ctx, b); err != nil {
			t.Errorf("docs/operations.md, SQL for DBAs, block %d: %v\n%s", i+1, err, b)
		}
	}
	if len(blocks) < 6 {
		t.Errorf("found %d SQL blocks in SQL for DBAs, want one per call at least", len(blocks))
	}
}

// TestDBABesideAllows runs the DBA functions beside many concurrent checks
// of the same id, through a pool (group commit, whose batches skip a row a
// DBA holds and send its calls again) and through connections of their
// own (whose checks wait for the row), and checks that no count, no
// denial and no call is lost.
func TestDBABesideAllows(t *testing.T) {
	const (
		callers    = 32
		ownConns   = 8 // of the callers, those on a connection of their own
		perCaller  = 25
		totalCalls = callers * perCaller
	)
	pool := dbaSchema(t, ownConns+6, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// storm runs check(l) perCaller times on each caller, and dba beside
	// them once a quarter of the calls are done; it returns when all have.
	storm := func(t *testing.T, check func(l *countlimit.Limiter) error, dba func(done *atomic.Int64)) {
		t.Helper()
		limiters := make([]*countlimit.Limiter, callers)
		pooled := countlimit.New(pgstore.New(pool))
		for i := range limiters {
			limiters[i] = pooled
			if i < ownConns {
				c, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Release()
				limiters[i] = countlimit.New(pgstore.New(c.Conn()))
			}
		}
		var (
			done atomic.Int64
			wg   sync.WaitGroup
			errs = make(chan error, totalCalls+1)
		)
		for _, l := range limiters {
			wg.Go(func() {
				for range perCaller {
					if err := check(l); err != nil {
						errs <- err
					}
					done.Add(1)
				}
			})
		}
		wg.Go(func() {
			for done.Load() < totalCalls/4 {
				time.Sleep(time.Millisecond)
			}
			dba(&done)
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	dbaCall := func(sql string, args ...any) (*int64, error) {
		var n *int64
		err := pool.QueryRow(ctx, sql, args...).Scan(&n)
		return n, err
	}

	t.Run("AdjustCount", func(t *testing.T) {
		rule := countlimit.Rule{UseType: "dba.adjust", Limit: 1 << 40, Window: countlimit.Rolling(time.Hour)}
		const primed = 10
		if _, err := countlimit.New(pgstore.New(pool)).AllowN(ctx, rule, "u1", primed); err != nil {
			t.Fatal(err)
		}
		var allowed, during atomic.Int64
		storm(t, func(l *countlimit.Limiter) error {
			r, err := l.Allow(ctx, rule, "u1")
			if err == nil && r.Allowed {
				allowed.Add(1)
			}
			return err
		}, func(done *atomic.Int64) {
			// Net -5, in steps, spread over the storm.
			for _, d := range []int64{-1, +3, -2, -1, -3, +1, -2} {
				if n, err := dbaCall(`SELECT countlimit_adjust_count('u1', 'dba.adjust', $1)`, d); err != nil || n == nil {
					t.Errorf("countlimit_adjust_count(%+d) = %s, %v", d, i64(n), err)
				}
				if done.Load() < totalCalls {
					during.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
		row, _ := readRow(t, pool, rule.UseType, "u1")
		if want := primed + allowed.Load() - 5; row.count != want {
			t.Errorf("count = %d, want %d: %d primed + %d allowed - 5 adjusted", row.count, want, primed, allowed.Load())
		}
		if allowed.Load() != totalCalls {
			t.Errorf("%d of %d checks allowed, want all (limit 2^40)", allowed.Load(), totalCalls)
		}
		t.Logf("%d of 7 adjustments ran while checks were in flight", during.Load())
	})

	t.Run("LiftPenaltyAndLower", func(t *testing.T) {
		// A limit the storm passes, with a penalty: the DBA lifts it and
		// gives room back while checks are denied, blocked and counted.
		rule := countlimit.Rule{UseType: "dba.lift", Limit: 100, Window: countlimit.Rolling(time.Hour), Block: time.Hour}
		var allowed, denied, lowered, lifts atomic.Int64
		storm(t, func(l *countlimit.Limiter) error {
			r, err := l.Allow(ctx, rule, "u1")
			switch {
			case err != nil:
			case r.Allowed:
				allowed.Add(1)
			default:
				denied.Add(1)
			}
			return err
		}, func(done *atomic.Int64) {
			// At most 20 rounds: the count, full at 100, never reaches 3,
			// so each lowering takes 3 off.
			for i := 0; i < 20 && done.Load() < totalCalls; i++ {
				n, err := dbaCall(`SELECT countlimit_lift_penalty('u1', 'dba.lift')`)
				if err != nil {
					t.Error(err)
					return
				}
				lifts.Add(*n)
				if n, err = dbaCall(`SELECT countlimit_adjust_count('u1', 'dba.lift', -3)`); err != nil || n == nil {
					t.Errorf("countlimit_adjust_count(-3) = %s, %v", i64(n), err)
					return
				}
				lowered.Add(3)
				time.Sleep(time.Millisecond)
			}
		})
		row, _ := readRow(t, pool, rule.UseType, "u1")
		if want := allowed.Load() - lowered.Load(); row.count != want {
			t.Errorf("count = %d, want %d allowed - %d lowered", row.count, allowed.Load(), lowered.Load())
		}
		if row.denied != denied.Load() {
			t.Errorf("denial tally = %d, want %d, the denied checks: a lift must keep every tally", row.denied, denied.Load())
		}
		if row.count > rule.Limit {
			t.Errorf("count %d over the limit %d", row.count, rule.Limit)
		}
		t.Logf("%d allowed, %d denied, %d lowered, %d penalties lifted", allowed.Load(), denied.Load(), lowered.Load(), lifts.Load())
	})

	t.Run("ResetID", func(t *testing.T) {
		rule := countlimit.Rule{UseType: "dba.reset", Limit: 1 << 40, Window: countlimit.Rolling(time.Hour)}
		var (
			mu   sync.Mutex
			used []int64
		)
		storm(t, func(l *countlimit.Limiter) error {
			r, err := l.Allow(ctx, rule, "u1")
			if err == nil {
				if !r.Allowed {
					return fmt.Errorf("Allow denied: %+v", r)
				}
				mu.Lock()
				used = append(used, r.Used)
				mu.Unlock()
			}
			return err
		}, func(*atomic.Int64) {
			if n, err := dbaCall(`SELECT countlimit_reset_id('u1', 'dba.reset')`); err != nil || i64(n) != "1" {
				t.Errorf("countlimit_reset_id = %s, %v; want 1", i64(n), err)
			}
		})
		// Allowed before the reset: Used 1..k; after it, 1..m, with m
		// what the row holds now and k + m every allowed check.
		row, _ := readRow(t, pool, rule.UseType, "u1")
		k := int64(len(used)) - row.count
		var want []int64
		for i := int64(1); i <= k; i++ {
			want = append(want, i)
		}
		for i := int64(1); i <= row.count; i++ {
			want = append(want, i)
		}
		slices.Sort(want)
		slices.Sort(used)
		if !slices.Equal(used, want) {
			t.Errorf("the checks' Used values are not 1..%d then 1..%d (count %d after the reset): a count was lost or doubled", k, row.count, row.count)
		}
		if k <= 0 || row.count <= 0 {
			t.Logf("the reset came at the storm's edge: %d checks before it, %d after", k, row.count)
		}
	})

	t.Run("AllowAllBesideWholeID", func(t *testing.T) {
		// Rows created in the reverse of key order, so that a function
		// that let its UPDATE or DELETE find them would lock them in
		// another order than AllowAll does.
		rules := []countlimit.Rule{
			{UseType: "dba.all.a", Limit: 5, Window: countlimit.Rolling(time.Hour), Block: time.Millisecond},
			{UseType: "dba.all.b", Limit: 5, Window: countlimit.Rolling(time.Hour), Block: time.Millisecond},
			{UseType: "dba.all.c", Limit: 5, Window: countlimit.Rolling(time.Hour), Block: time.Millisecond},
		}
		l := countlimit.New(pgstore.New(pool))
		for i := len(rules) - 1; i >= 0; i-- {
			for range 6 {
				if _, err := l.Allow(ctx, rules[i], "u1"); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := pool.Exec(ctx, `SELECT countlimit_adjust_count('u1', use_type, -5) FROM unnest($1::text[]) AS use_type`,
			[]string{"dba.all.a", "dba.all.b", "dba.all.c"}); err != nil {
			t.Fatal(err)
		}
		storm(t, func(l *countlimit.Limiter) error {
			_, err := l.AllowAll(ctx, "u1", rules...)
			return err
		}, func(done *atomic.Int64) {
			for i := 0; done.Load() < totalCalls; i++ {
				sql := `SELECT countlimit_lift_penalty('u1')`
				if i%4 == 3 {
					sql = `SELECT countlimit_reset_id('u1')`
				}
				if _, err := dbaCall(sql); err != nil {
					t.Errorf("%s: %v", sql, err)
					return
				}
			}
		})
		var counts []int64
		for _, r := range rules {
			row, _ := readRow(t, pool, r.UseType, "u1")
			counts = append(counts, row.count)
		}
		if counts[0] != counts[1] || counts[1] != counts[2] || counts[0] > 5 {
			t.Errorf("counts of the three rules = %v, want equal (AllowAll is all or nothing) and at most 5", counts)
		}
	})
}

// TestPingWantsTheLatestSchema checks that Ping reports a schema that is
// missing, or that lacks the newest migration's function (a database at
// v0.1.0 has countlimit_apply without smooth intervals and bursts), as not
// at its latest migration.
func TestPingWantsTheLatestSchema(t *testing.T) {
	pool := dbaSchema(t, 2, nil)
	ctx := context.Background()
	if err := pgstore.New(pool).Ping(ctx); err != nil {
		t.Fatalf("Ping at the latest migration: %v", err)
	}
	p := migrator(t, pool)
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.New(pool).Ping(ctx); !errors.Is(err, countlimit.ErrUnavailable) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Ping with no schema = %v, want ErrUnavailable saying the schema is missing", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.New(pool).Ping(ctx); !errors.Is(err, countlimit.ErrUnavailable) || !strings.Contains(err.Error(), "latest migration") {
		t.Errorf("Ping at v0.1.0's schema (migration 1) = %v, want ErrUnavailable saying the schema is not at its latest migration", err)
	}
}
