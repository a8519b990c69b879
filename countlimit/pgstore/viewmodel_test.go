package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// viewRow is a row of count_limit_status, times in µs (0 for NULL) and
// intervals in µs (-1 for NULL).
type viewRow struct {
	kind                     string
	used, remaining          int64
	begin, end, resetsIn     int64
	blocked                  bool
	blockedUntil, blockedFor int64
}

func (v viewRow) String() string {
	return fmt.Sprintf("{%s used %d remaining %d [%d, %d) resets_in %d blocked %v until %d for %d}",
		v.kind, v.used, v.remaining, v.begin, v.end, v.resetsIn, v.blocked, v.blockedUntil, v.blockedFor)
}

// expectRow is what the model says count_limit_status shows of d at now:
// a Peek, at now, of the rule the row records (its kind, limit_value,
// smooth_interval and smooth_burst), by the view's column comments. While
// nothing is counted in a window or a sliding log the view's window_begin
// and window_end are those of the row's last window, which a Peek does not
// report (it names the window a check would open): they are left out then
// (-2).
func (w *world) expectRow(d *drawnKey, now time.Time) (viewRow, error) {
	k := w.key(d.ut, d.id)
	nowUS := now.UnixMicro()
	peek := func(r countlimit.Rule) (countlimit.Result, driver.State, error) {
		r.Limit = d.limit
		if expose.WindowOf(r.Window).Smooth {
			r = smoothRule(d.ut, d.interval, d.burst, d.limit)
		}
		var res countlimit.Result
		var err error
		got, _ := w.call(now, func(l *countlimit.Limiter) { res, err = l.Peek(context.Background(), r, d.id) })
		if err != nil || got == nil {
			return res, driver.State{}, fmt.Errorf("model Peek(%v limit %d): %v", r.Window, r.Limit, err)
		}
		return res, got.Checks[0].State, nil
	}
	// The kind the row shows, as the view picks it (window_kind's
	// comment): live leases first, then the row's own form.
	kind := "window"
	var rule countlimit.Rule
	switch {
	case d.kind != nil && *d.kind == "smooth":
		kind = "smooth"
	case k.Log != nil:
		kind = "sliding"
	case k.End == model.Forever:
		kind = "lifetime"
	case d.kind != nil:
		kind = *d.kind
	}
	if r, ok := d.rule(kind); ok {
		rule = r
	} else {
		// No rule of that kind counted here (a row of leases and denials,
		// or CheckLimit's window): any window reads the row's count.
		rule = countlimit.Rule{UseType: countlimit.UseType(d.ut), Window: countlimit.Rolling(time.Hour)}
		for _, r := range d.rules {
			if !expose.WindowOf(r.Window).Concurrent && !expose.WindowOf(r.Window).Smooth && windowKind(r.Window) != "sliding" {
				rule = r
			}
		}
	}
	res, st, err := peek(rule)
	if err != nil {
		return viewRow{}, err
	}
	if r, ok := d.rule("concurrent"); ok && len(k.Leases) > 0 {
		live := 0
		for _, e := range k.Leases {
			if e > nowUS {
				live++
			}
		}
		if live > 0 || res.Used == 0 {
			kind = "concurrent"
			if res, st, err = peek(r); err != nil {
				return viewRow{}, err
			}
		}
	}
	us := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixMicro()
	}
	v := viewRow{kind: kind, used: res.Used, remaining: res.Remaining, begin: us(st.Begin), end: us(st.End),
		resetsIn: -1, blockedUntil: us(st.BlockedUntil), blockedFor: -1}
	switch kind {
	case "concurrent":
		// window_begin: when the oldest live lease was taken.
		v.begin = 0
		for token, e := range k.Leases {
			if e > nowUS && (v.begin == 0 || d.taken[token] < v.begin) {
				v.begin = d.taken[token]
			}
		}
	case "smooth":
	default:
		if v.used == 0 {
			v.begin, v.end = -2, -2
		}
	}
	if v.used > 0 && v.end > 0 {
		v.resetsIn = v.end - nowUS
	}
	if v.blocked = v.blockedUntil > 0; v.blocked {
		v.blockedFor = v.blockedUntil - nowUS
	}
	return v, nil
}

// readView reads count_limit_status's rows of use types that begin with
// prefix, by use type and id.
func readView(ctx context.Context, tx pgx.Tx, prefix string) (map[[2]string]viewRow, error) {
	rows, err := tx.Query(ctx, `SELECT use_type, unique_id, window_kind, used, remaining,
			coalesce((extract(epoch FROM window_begin) * 1000000)::bigint, 0),
			coalesce((extract(epoch FROM window_end) * 1000000)::bigint, 0),
			coalesce((extract(epoch FROM resets_in) * 1000000)::bigint, -1),
			blocked,
			coalesce((extract(epoch FROM blocked_until) * 1000000)::bigint, 0),
			coalesce((extract(epoch FROM blocked_for) * 1000000)::bigint, -1)
		FROM count_limit_status WHERE starts_with(use_type, $1)`, prefix)
	if err != nil {
		return nil, err
	}
	out := map[[2]string]viewRow{}
	for rows.Next() {
		var ut, id string
		var v viewRow
		var used, remaining *int64
		if err := rows.Scan(&ut, &id, &v.kind, &used, &remaining, &v.begin, &v.end, &v.resetsIn, &v.blocked, &v.blockedUntil, &v.blockedFor); err != nil {
			return nil, err
		}
		v.used, v.remaining = -1, -1 // NULL
		if used != nil {
			v.used = *used
		}
		if remaining != nil {
			v.remaining = *remaining
		}
		out[[2]string{ut, id}] = v
	}
	return out, rows.Err()
}

// TestViewIsTheModel holds count_limit_status to the reference model:
// keys of every kind (windows fixed, rolling, calendar and CheckLimit's,
// lifetime, sliding logs, smooth TATs, leases, and counts carried from one
// kind to another; penalties and denial tallies) drawn from a seed and
// written in one transaction; each row of the view read in it must show
// what a Peek at that transaction's now() reports of the rule the row
// records: used, remaining, window_begin and window_end, resets_in,
// blocked, blocked_until and blocked_for.
func TestViewIsTheModel(t *testing.T) {
	pool := testbackend.Postgres(t)
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
	rng := rand.New(rand.NewPCG(seed, 0x76696577))
	w := newWorld()
	prefix := fmt.Sprintf("view%d.", seed%1e6)
	var drawn []*drawnKey
	for i := range n {
		kind := keyKinds[i%len(keyKinds)]
		d := w.draw(rng, kind, fmt.Sprintf("%s%s.%d", prefix, kind, i), pick(rng, "a", "用户:42", "x{y}"), now)
		if err := w.seed(ctx, tx, d); err != nil {
			t.Fatalf("seed %d (%s): writing %s: %v", seed, replay, d.ut, err)
		}
		drawn = append(drawn, d)
	}
	rows, err := readView(ctx, tx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	failed, compared := 0, map[string]int{}
	for _, d := range drawn {
		k := w.key(d.ut, d.id)
		got, ok := rows[[2]string{d.ut, d.id}]
		if keystate.Empty(k) {
			if ok {
				t.Errorf("seed %d: (%s, %s) keeps nothing, and the view shows %v", seed, d.ut, d.id, got)
			}
			continue
		}
		want, err := w.expectRow(d, now)
		if err != nil {
			t.Fatal(err)
		}
		if want.begin == -2 {
			got.begin, got.end = -2, -2
		}
		compared[want.kind]++
		if !ok || got != want {
			failed++
			if failed <= 5 {
				t.Errorf("seed %d (%s): count_limit_status of (%s, %s) at now() %d:\n got  %v\n want %v (the model's Peek)\nthe key: %s\nmade by:\n  %s",
					seed, replay, d.ut, d.id, now.UnixMicro(), got, want, modeltest.Canon(*k, d.span(), now.UnixMicro(), true), strings.Join(d.how, "\n  "))
			}
		}
	}
	if failed > 0 {
		t.Errorf("seed %d: %d of %d rows differ from the model", seed, failed, len(drawn))
	}
	for _, kind := range []string{"fixed", "rolling", "calendar", "lifetime", "sliding", "smooth", "concurrent", "window"} {
		if compared[kind] == 0 && n >= 100 {
			t.Errorf("seed %d: no row of kind %s compared (%v)", seed, kind, compared)
		}
	}
	t.Logf("seed %d: %d keys, rows compared by kind: %v", seed, len(drawn), compared)
}
