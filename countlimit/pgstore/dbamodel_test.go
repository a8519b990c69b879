package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
)

// dbaModel carries out the DBA functions on the model's keys as
// docs/operations.md, "SQL for DBAs", states them, at now (the
// database's now()).
type dbaModel struct {
	w   *world
	now int64
}

// dbaResult is what a DBA function returned: a number, NULL (with the
// notice's reason), or an error's SQLSTATE.
type dbaResult struct {
	n      *int64
	notice string
	code   string
}

func (r dbaResult) String() string {
	switch {
	case r.code != "":
		return "error " + r.code
	case r.n == nil:
		return fmt.Sprintf("NULL (notice %q)", r.notice)
	}
	return fmt.Sprint(*r.n)
}

func ret(n int64) dbaResult { return dbaResult{n: &n} }

// adjust is countlimit_adjust_count(id, ut, delta) ("Raise or lower a
// count"): delta is added to the count of the current window, never below
// 0, and the new count returned; no row, or no current window: NULL and a
// notice, nothing written; a sliding window (window_kind sliding):
// refused (0A000); a smooth limit: delta moves the TAT by delta intervals,
// never before now (lowering a drained key changes nothing) and never past
// a full burst, and the new used, ceil((TAT - now) / interval), is
// returned and kept as the row's count. Leases, the window's bounds, the
// penalty and the tally stay as they are.
func (m dbaModel) adjust(d *drawnKey, delta int64) dbaResult {
	k := m.w.key(d.ut, d.id)
	switch {
	case keystate.Empty(k):
		return dbaResult{notice: "no row"}
	case d.kind != nil && *d.kind == "smooth":
		t, b := d.interval, d.burst
		ahead := max(k.TAT-m.now, 0)
		if ahead == 0 && delta <= 0 {
			return ret(0)
		}
		steps := max(-b-1, min(delta, b+1)) // beyond these, a bound is met anyway
		ahead = max(0, min(ahead+steps*t, b*t))
		used := min(b, (ahead+t-1)/t)
		k.TAT, k.Begin, k.End, k.Count = m.now+ahead, 0, m.now+ahead, used
		return ret(used)
	case k.Log != nil || (d.kind != nil && *d.kind == "sliding"):
		return dbaResult{code: "0A000"}
	case !(k.Begin < k.End && m.now < k.End):
		return dbaResult{notice: "has no current window"}
	}
	k.Count = max(0, k.Count+delta)
	return ret(k.Count)
}

// lift is countlimit_lift_penalty(id, ut) ("Lift a penalty"), of every use
// type of the id when ut is "": the penalty ends on every clock
// (blocked_until NULL), the count, window and tally stay; it returns how
// many rows were blocked at now.
func (m dbaModel) lift(keys []*drawnKey, id, ut string) dbaResult {
	var n int64
	for _, d := range keys {
		k := m.w.key(d.ut, d.id)
		if d.id != id || (ut != "" && d.ut != ut) || keystate.Empty(k) {
			continue
		}
		if k.Blocked > m.now {
			n++
		}
		k.Blocked = 0
	}
	return ret(n)
}

// reset is countlimit_reset_id(id, ut) ("Reset an id"), of every use type
// of the id when ut is "": what Limiter.Reset does (driver.OpReset), the
// rows and their leases gone; it returns how many rows it deleted.
func (m dbaModel) reset(keys []*drawnKey, id, ut string) dbaResult {
	var n int64
	for _, d := range keys {
		k := m.w.key(d.ut, d.id)
		if d.id != id || (ut != "" && d.ut != ut) {
			continue
		}
		if !keystate.Empty(k) {
			n++
		}
		*k = model.Key{}
		// The leases' holders keep their Leases, which no longer hold.
		d.kind, d.limit, d.interval, d.burst, d.exists, d.taken = nil, 0, 0, 0, false, map[string]int64{}
	}
	return ret(n)
}

// draw draws a DBA call on the keys of id, and says what the model makes
// of it: countlimit_adjust_count on one use type (half the time on a
// smooth row, where the TAT moves by whole intervals and used is rounded
// up; now and then on a use type with no row), or
// countlimit_lift_penalty or countlimit_reset_id on one use type or all.
func (m dbaModel) draw(rng *rand.Rand, keys []*drawnKey, id string) (sql string, args []any, want dbaResult) {
	d := keys[rng.IntN(len(keys))]
	ut := d.ut
	switch p := rng.IntN(10); {
	case p < 6:
		if smooth := slices.DeleteFunc(slices.Clone(keys), func(k *drawnKey) bool {
			return k.kind == nil || *k.kind != "smooth"
		}); len(smooth) > 0 && rng.IntN(2) == 0 {
			d = pick(rng, smooth...)
			ut = d.ut
		}
		delta := pick(rng, int64(-1000), -5, -3, -2, -1, -1, 0, 1, 1, 2, 3, 5, 1000)
		if rng.IntN(10) == 0 {
			return `SELECT countlimit_adjust_count($1, $2, $3)`, []any{id, "dba.none", delta}, dbaResult{notice: "no row"}
		}
		return `SELECT countlimit_adjust_count($1, $2, $3)`, []any{id, ut, delta}, m.adjust(d, delta)
	case p < 8:
		if rng.IntN(2) == 0 {
			return `SELECT countlimit_lift_penalty($1)`, []any{id}, m.lift(keys, id, "")
		}
		return `SELECT countlimit_lift_penalty($1, $2)`, []any{id, ut}, m.lift(keys, id, ut)
	}
	if rng.IntN(2) == 0 {
		return `SELECT countlimit_reset_id($1)`, []any{id}, m.reset(keys, id, "")
	}
	return `SELECT countlimit_reset_id($1, $2)`, []any{id, ut}, m.reset(keys, id, ut)
}

// next draws a check of one of d's rules at at and carries it out on the
// model: Peek, AllowN or Refund, or for a concurrency limit Acquire,
// Extend or Release of a lease the key's checks took. It returns what it
// was, its rule, and its request with the model's States and without;
// nil requests when the Limiter sent none.
func (d *drawnKey) next(w *world, rng *rand.Rand, at time.Time) (what string, r countlimit.Rule, got, sent *driver.Request) {
	ctx := context.Background()
	r = pick(rng, d.rules...)
	n := pick(rng, int64(1), 1, 2)
	got, sent = w.call(at, func(l *countlimit.Limiter) {
		switch p := rng.IntN(6); {
		case expose.WindowOf(r.Window).Concurrent && p < 3:
			what = "Acquire"
			if ls, res, err := l.Acquire(ctx, r, d.id); err == nil && res.Allowed {
				d.leases = append(d.leases, ls)
			}
		case expose.WindowOf(r.Window).Concurrent && p == 4 && len(d.leases) > 0:
			what = "Release"
			d.leases[rng.IntN(len(d.leases))].Release(ctx)
		case expose.WindowOf(r.Window).Concurrent && p == 5 && len(d.leases) > 0:
			what = "Extend"
			d.leases[rng.IntN(len(d.leases))].Extend(ctx)
		case expose.WindowOf(r.Window).Concurrent || p < 2:
			what = "Peek"
			l.Peek(ctx, r, d.id)
		case p < 5:
			what = fmt.Sprintf("AllowN(%d)", n)
			l.AllowN(ctx, r, d.id, n)
		default:
			what = fmt.Sprintf("Refund(%d)", n)
			l.Refund(ctx, r, d.id, n)
		}
	})
	return what, r, got, sent
}

// callDBA runs one DBA call in a savepoint of tx, so that an error leaves
// tx usable, and says what it returned; notice is the last notice the
// connection received.
func callDBA(ctx context.Context, tx pgx.Tx, notice func() string, sql string, args ...any) (dbaResult, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return dbaResult{}, err
	}
	var r dbaResult
	err = sp.QueryRow(ctx, sql, args...).Scan(&r.n)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		r.code = pgErr.Code
		return r, sp.Rollback(ctx)
	}
	if err != nil {
		return r, err
	}
	if r.n == nil {
		r.notice = notice()
	}
	return r, sp.Commit(ctx)
}

// keyText is a key exactly, but for a log or leases that are empty
// rather than none.
func keyText(k model.Key) string {
	var leases []string
	for _, t := range slices.Sorted(maps.Keys(k.Leases)) {
		leases = append(leases, fmt.Sprintf("%.6s@%d", t, k.Leases[t]))
	}
	end := fmt.Sprint(k.End)
	if k.End == model.Forever {
		end = "forever"
	}
	return fmt.Sprintf("{count %d [%d, %s) log %v tat %d denied %d blocked %d leases %v}", k.Count, k.Begin, end, k.Log, k.TAT, k.Denied, k.Blocked, leases)
}

// TestDBAFunctionsAreTheModel holds the DBA functions that write state to
// the reference model, as docs/operations.md states them: on ids with
// keys of every kind drawn from a seed (as TestViewIsTheModel draws them),
// in one transaction, each id gets one or two calls of
// countlimit_adjust_count (deltas up and down, on every kind, smooth keys
// at and beside whole intervals), countlimit_lift_penalty and
// countlimit_reset_id (one use type, or all of the id); what each returns,
// the rows it leaves (read back as the model harness reads them, exactly)
// and what checks through pgstore decide next (Peek, AllowN, Refund,
// Acquire, at now() and after) must be what the model says of the same
// change.
func TestDBAFunctionsAreTheModel(t *testing.T) {
	pool, lastNotice := dbaSchemaNotices(t, 2)
	ctx := context.Background()
	seed, n := modeltest.Seed(), modeltest.Steps(300)
	replay := fmt.Sprintf("COUNTLIMIT_MODEL_SEED=%d COUNTLIMIT_MODEL_STEPS=%d to replay", seed, n)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var now time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	nowUS := now.UnixMicro()
	rng := rand.New(rand.NewPCG(seed, 0x646261))
	w := newWorld()
	m := dbaModel{w: w, now: nowUS}
	store := pgstore.New(tx)
	read := func(d *drawnKey) model.Key {
		t.Helper()
		k, err := readKey(ctx, tx, d.ut, d.id)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	failed := 0
	fail := func(format string, args ...any) {
		t.Helper()
		if failed++; failed <= 5 {
			t.Errorf("seed %d (%s): "+format, append([]any{seed, replay}, args...)...)
		}
	}
	calls := map[string]int{}
groups:
	for group := 0; group < n/3; group++ {
		id := fmt.Sprintf("g%d", group)
		var keys []*drawnKey
		for j := range 1 + rng.IntN(4) {
			kind := pick(rng, keyKinds...)
			d := w.draw(rng, kind, fmt.Sprintf("dba.%s.%d", kind, j), id, now)
			if err := w.seed(ctx, tx, d); err != nil {
				t.Fatalf("seed %d: writing %s: %v", seed, d.ut, err)
			}
			keys = append(keys, d)
		}
		describe := func() string {
			var b strings.Builder
			for _, d := range keys {
				fmt.Fprintf(&b, "\n  (%s, %s) %s, made by:\n    %s", d.ut, d.id, keyText(*w.key(d.ut, d.id)), strings.Join(d.how, "\n    "))
			}
			return b.String()
		}
		for range 1 + rng.IntN(2) {
			before := describe()
			sql, args, want := m.draw(rng, keys, id)
			name, _, _ := strings.Cut(strings.TrimPrefix(sql, "SELECT "), "(")
			calls[name]++
			got, err := callDBA(ctx, tx, lastNotice, sql, args...)
			if err != nil {
				t.Fatalf("%s %v: %v", sql, args, err)
			}
			call := fmt.Sprintf("%s %v at now() %d", sql, args, nowUS)
			if got.String() != want.String() && !(want.n == nil && want.code == "" && got.n == nil && got.code == "" && strings.Contains(got.notice, want.notice)) {
				fail("%s returned %v, want %v (docs/operations.md)\nbefore:%s", call, got, want, before)
				continue groups
			}
			for _, k := range keys {
				if g, m := keyText(read(k)), keyText(normal(*w.key(k.ut, k.id))); g != m {
					fail("after %s, (%s, %s) keeps\n  %s\nwant\n  %s (docs/operations.md)\nbefore:%s", call, k.ut, id, g, m, before)
					continue groups
				}
			}
		}
		// What the next checks decide.
		for _, d := range keys {
			at := now
			for range 1 + rng.IntN(3) {
				at = at.Add(pick(rng, 0, time.Microsecond, time.Duration(rng.Int64N(int64(reach(d.rules[0])/2)+1))))
				before := keyText(*w.key(d.ut, d.id))
				what, r, want, sent := d.next(w, rng, at)
				if sent == nil {
					continue
				}
				calls["next "+what]++
				if err := store.Do(ctx, sent); err != nil {
					t.Fatalf("%s %v: %v", what, r.Window, err)
				}
				step := fmt.Sprintf("%s(%s %v limit %d, %s) at now()%+dµs", what, d.ut, r.Window, r.Limit, d.id, at.UnixMicro()-nowUS)
				if g, m := stateText(sent.Checks[0].State), stateText(want.Checks[0].State); g != m {
					fail("after the DBA calls, %s: pgstore %s, the model %s\nthe key before: %s%s", step, g, m, before, describe())
					continue groups
				}
				if g, m := modeltest.Canon(read(d), d.span(), at.UnixMicro(), true), modeltest.Canon(*w.key(d.ut, d.id), d.span(), at.UnixMicro(), true); g != m {
					fail("after the DBA calls, %s: PostgreSQL keeps %s, the model %s\nthe key before: %s%s", step, g, m, before, describe())
					continue groups
				}
			}
		}
	}
	if failed > 0 {
		t.Errorf("seed %d: %d differences from the model", seed, failed)
	}
	t.Logf("seed %d: calls %v", seed, calls)
}

// normal is k as the harness reads a row back: an empty log is none.
func normal(k model.Key) model.Key {
	if len(k.Log) == 0 {
		k.Log = nil
	}
	if len(k.Leases) == 0 {
		k.Leases = nil
	}
	return k
}

func stateText(s driver.State) string {
	t := func(v time.Time) string {
		if v.IsZero() {
			return "-"
		}
		return fmt.Sprint(v.UnixMicro())
	}
	return fmt.Sprintf("{%v used %d [%s, %s) blocked %s free %s}", s.Allowed, s.Used, t(s.Begin), t(s.End), t(s.BlockedUntil), t(s.FreeAt))
}
