package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// The view count_limit_status and the DBA functions that write state
// (countlimit_adjust_count, countlimit_lift_penalty, countlimit_reset_id)
// are copies of the contract too, in SQL of their own: they are held to
// the reference model (TestViewIsTheModel, TestDBAFunctionsAreTheModel)
// on keys of every kind drawn from a seed (COUNTLIMIT_MODEL_SEED to replay
// one; COUNTLIMIT_MODEL_STEPS sets about how many keys, 300 by default).
// Each test works in one transaction, whose now() is the "now" of the
// view and of the functions, and rolls it back. Keys are drawn around that
// now(): a seed replays the same draws around a later one, where windows
// aligned to the clock (fixed, calendar) may fall otherwise; a failure
// prints the now() and the checks that made each key.

// world is the model's state of the keys a test draws, behind a Limiter
// whose clock the test sets: a call of the Limiter is carried out by
// model.Apply, and its request kept, so that the same request can be
// sent to PostgreSQL.
type world struct {
	at   time.Time
	l    *countlimit.Limiter
	keys map[[2]string]*model.Key
	// sent is the last request as the Limiter made it; got the same, with
	// the model's States. Both nil when the Limiter sent none.
	sent, got *driver.Request
}

func newWorld() *world {
	w := &world{keys: map[[2]string]*model.Key{}}
	w.l = countlimit.New(w, countlimit.WithClock(func() time.Time { return w.at }))
	return w
}

func (w *world) key(ut, id string) *model.Key {
	k := w.keys[[2]string{ut, id}]
	if k == nil {
		k = &model.Key{}
		w.keys[[2]string{ut, id}] = k
	}
	return k
}

func (w *world) Do(_ context.Context, r *driver.Request) error {
	w.sent = cloneRequest(r)
	keys := make([]*model.Key, len(r.Checks))
	for i := range r.Checks {
		keys[i] = w.key(r.Checks[i].UseType, r.ID)
	}
	model.Apply(r, keys)
	w.got = cloneRequest(r)
	return nil
}

func cloneRequest(r *driver.Request) *driver.Request {
	c := *r
	c.Checks = slices.Clone(r.Checks)
	return &c
}

// call runs f at at on the model and returns the request it made, with
// the model's States, and the same request without them; nil when f made
// none.
func (w *world) call(at time.Time, f func(l *countlimit.Limiter)) (got, sent *driver.Request) {
	w.at, w.sent, w.got = at, nil, nil
	f(w.l)
	return w.got, w.sent
}

// drawnKey is one key a test draws: the model's state of it, and what a
// count_limit row keeps besides, as the checks that made it wrote it.
type drawnKey struct {
	ut, id string
	// rules are the rules that counted on the key, the first its own; a
	// second is of another kind, on the same use type.
	rules []countlimit.Rule
	// kind, limit, interval and burst are the row's window_kind (nil for
	// NULL), limit_value, smooth_interval (µs; 0 for NULL) and
	// smooth_burst, as the last check that wrote each left it.
	kind            *string
	limit           int64
	interval, burst int64
	// exists is whether the model keeps anything of the key, as of the
	// last check drawn: a row for it.
	exists bool
	// taken is when each lease was taken (count_limit_lease.taken_at), µs.
	taken  map[string]int64
	leases []countlimit.Lease
	// how is what made the key, for failure messages.
	how []string
}

func (d *drawnKey) rule(kind string) (countlimit.Rule, bool) {
	for _, r := range d.rules {
		if windowKind(r.Window) == kind {
			return r, true
		}
	}
	return countlimit.Rule{}, false
}

// windowKind is a window's kind as count_limit.window_kind names it.
func windowKind(w countlimit.Window) string {
	k, _, _ := strings.Cut(w.String(), " ")
	return k
}

// span is the key's sliding span in µs, 0 when no rule of it slides.
func (d *drawnKey) span() int64 {
	if r, ok := d.rule("sliding"); ok {
		return expose.WindowOf(r.Window).Duration.Microseconds()
	}
	return 0
}

// smoothTB are emission intervals (µs) and bursts: whole and odd
// microseconds, intervals that are not whole seconds (3 a second is one
// every 333334µs), a burst of a million, and bursts that take 100 years
// to drain, so that ceil((TAT - now) / interval) is tested where
// arithmetic in seconds, or in floating point, would round it wrong.
var smoothTB = [][2]int64{
	{1, 1}, {1, 5}, {3, 4}, {333334, 3}, {2333334, 2}, {999999, 4}, {1000001, 3},
	{514285715, 7}, {3000000007, 1000000}, {7, 1 << 40}, {3153600000000000, 1}, {1576799999999999, 2},
}

var zonesForKeys = []string{"UTC", "America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe"}

// smoothRule is a smooth rule of limit whose emission interval is t µs.
func smoothRule(ut string, t, burst, limit int64) countlimit.Rule {
	period := t
	if limit > 1 {
		period = t * limit
	}
	r := countlimit.Rule{UseType: countlimit.UseType(ut), Limit: limit,
		Window: countlimit.Smooth(time.Duration(period)*time.Microsecond, burst)}
	if got := expose.Interval(r.Window, limit).Microseconds(); got != t {
		panic(fmt.Sprintf("smooth rule %v limit %d: interval %dµs, want %d", r.Window, limit, got, t))
	}
	return r
}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

// drawRule draws a rule of kind on ut: limits from 0 to 5, a penalty half
// the time.
func drawRule(rng *rand.Rand, kind, ut string) countlimit.Rule {
	r := countlimit.Rule{UseType: countlimit.UseType(ut), Limit: int64(rng.IntN(6))}
	if r.Limit == 0 && rng.IntN(3) > 0 {
		r.Limit = 1
	}
	if rng.IntN(2) == 0 {
		r.Block = pick(rng, 1500*time.Millisecond, 7*time.Second, time.Minute, 2*time.Hour)
	}
	d := pick(rng, 3*time.Second, 7*time.Second, time.Minute, 90*time.Minute, 2500017*time.Microsecond)
	switch kind {
	case "fixed":
		r.Window = countlimit.Fixed(d)
	case "rolling":
		r.Window = countlimit.Rolling(d)
	case "calendar":
		loc, err := time.LoadLocation(pick(rng, zonesForKeys...))
		if err != nil {
			panic(err)
		}
		r.Window = countlimit.Calendar(pick(rng, countlimit.Day, countlimit.Week, countlimit.Month), loc)
	case "lifetime":
		r.Window = countlimit.Lifetime()
	case "sliding":
		r.Window = countlimit.Sliding(pick(rng, 4*time.Second, 9*time.Second, time.Minute, time.Hour, 3333337*time.Microsecond))
	case "concurrent":
		r.Window = countlimit.Concurrent(pick(rng, 2*time.Second, 6*time.Second, time.Minute, time.Hour))
	case "smooth":
		tb := pick(rng, smoothTB...)
		if rng.IntN(4) == 0 {
			tb = [2]int64{1 + 2*rng.Int64N(2500000), 1 + rng.Int64N(6)}
		}
		limit := min(r.Limit, expose.MaxDuration.Microseconds()/tb[0])
		block := r.Block
		r = smoothRule(ut, tb[0], tb[1], limit)
		r.Block = block
	default:
		panic("no kind " + kind)
	}
	return r
}

// reach is how far apart a key's checks are drawn: about a window, a
// span, a lease's ttl or a burst's draining (at most 20 years).
func reach(r countlimit.Rule) time.Duration {
	switch windowKind(r.Window) {
	case "calendar":
		return 40 * 24 * time.Hour
	case "lifetime":
		return time.Hour
	case "smooth":
		return min(time.Duration(expose.WindowOf(r.Window).Burst)*expose.Interval(r.Window, r.Limit), 20*365*24*time.Hour)
	}
	return expose.WindowOf(r.Window).Duration
}

// otherKinds are the kinds a second rule on a key's use type may have,
// by the kind of the first: counts carried over from one to the other,
// and a key that holds both leases and a count.
var otherKinds = map[string][]string{
	"smooth":     {"fixed", "sliding", "rolling", "lifetime"},
	"fixed":      {"sliding", "smooth"},
	"rolling":    {"smooth"},
	"lifetime":   {"sliding"},
	"sliding":    {"fixed", "smooth"},
	"concurrent": {"fixed"},
}

var keyKinds = []string{"fixed", "rolling", "calendar", "lifetime", "sliding", "smooth", "concurrent", "checklimit"}

// draw makes a key of kind for (ut, id) around now: a run of checks at
// instants up to twice its reach before now and an eighth after (a
// Limiter whose clock runs ahead of the database's), carried out by the
// model; or, for some smooth keys, a TAT drawn at whole intervals from
// now and a microsecond on either side of them. A quarter of the keys
// that hold something get a penalty that ends at now, or a microsecond
// before or after it.
func (w *world) draw(rng *rand.Rand, kind, ut, id string, now time.Time) *drawnKey {
	d := w.drawChecks(rng, kind, ut, id, now)
	if k := w.key(ut, id); !keystate.Empty(k) && rng.IntN(4) == 0 {
		k.Blocked, k.Denied = now.UnixMicro()+pick(rng, int64(-1), 0, 1), max(k.Denied, 1)
		d.how = append(d.how, fmt.Sprintf("blocked until now%+dµs", k.Blocked-now.UnixMicro()))
	}
	return d
}

func (w *world) drawChecks(rng *rand.Rand, kind, ut, id string, now time.Time) *drawnKey {
	d := &drawnKey{ut: ut, id: id, taken: map[string]int64{}}
	ctx := context.Background()
	if kind == "smooth" && rng.IntN(2) == 0 {
		r := drawRule(rng, "smooth", ut)
		d.rules = []countlimit.Rule{r}
		t, b := expose.Interval(r.Window, r.Limit).Microseconds(), expose.WindowOf(r.Window).Burst
		k := pick(rng, 0, 1, 1, 2, b-1, b, rng.Int64N(b+1))
		ahead := max(0, k)*t + pick(rng, int64(-1), 0, 1)
		if rng.IntN(8) == 0 {
			ahead = -pick(rng, int64(1), t, 5*t)
		}
		ahead = min(ahead, b*t)
		tat := now.UnixMicro() + ahead
		*w.key(ut, id) = model.Key{Count: min(b, max(0, ahead+t-1)/t), End: tat, TAT: tat,
			Denied: rng.Int64N(3), Blocked: pick(rng, 0, 0, now.UnixMicro()+pick(rng, int64(-1), 0, 1, 5e6))}
		s := "smooth"
		d.kind, d.limit, d.interval, d.burst, d.exists = &s, r.Limit, t, b, true
		d.how = append(d.how, fmt.Sprintf("TAT now%+dµs (%d intervals of %dµs%+d), burst %d", ahead, k, t, ahead-max(0, k)*t, b))
		return d
	}
	if kind == "checklimit" {
		dur := pick(rng, 3*time.Second, 90*time.Second, 2500017*time.Microsecond)
		limit := int64(1 + rng.IntN(3))
		d.rules = []countlimit.Rule{{UseType: countlimit.UseType(ut), Limit: limit, Window: countlimit.Rolling(dur)}}
		at := now.Add(-time.Duration(rng.Int64N(int64(3 * dur))))
		for range 1 + rng.IntN(6) {
			at = at.Add(time.Duration(rng.Int64N(int64(dur))))
			begin := time.Time{}
			if rng.IntN(2) == 0 {
				begin = at.Add(-time.Duration(rng.Int64N(int64(dur))))
			}
			got, _ := w.call(at, func(l *countlimit.Limiter) { l.CheckLimit(ctx, countlimit.UseType(ut), id, limit, dur, begin) })
			d.how = append(d.how, fmt.Sprintf("%s CheckLimit(%d, %v, %s)", at.UTC().Format("2006-01-02T15:04:05.000000"), limit, dur, begin.UTC().Format("15:04:05.000000")))
			d.wrote(got, w.key(ut, id))
		}
		return d
	}
	d.rules = []countlimit.Rule{drawRule(rng, kind, ut)}
	if alt := otherKinds[kind]; len(alt) > 0 && rng.IntN(3) == 0 {
		d.rules = append(d.rules, drawRule(rng, pick(rng, alt...), ut))
		// The other rule writes its limit (up to 6) in the row: a smooth
		// rule of that limit and the row's interval must be one, which
		// takes an interval of 1/6 of 100 years at the most.
		if r, ok := d.rule("smooth"); ok && expose.Interval(r.Window, r.Limit) > expose.MaxDuration/6 {
			d.rules = d.rules[:1]
		}
	}
	far := reach(d.rules[0])
	var ats []time.Time
	for range 1 + rng.IntN(10) {
		ats = append(ats, now.Add(time.Duration(float64(far)*(rng.Float64()*2.125-2))))
	}
	slices.SortFunc(ats, time.Time.Compare)
	if len(ats) > 1 && rng.IntN(4) == 0 {
		ats[len(ats)-1] = ats[len(ats)-2].Add(-time.Duration(rng.Int64N(int64(far/4) + 1))) // a late read
	}
	for _, at := range ats {
		r := d.rules[0]
		if len(d.rules) > 1 && rng.IntN(3) == 0 {
			r = d.rules[1]
		}
		if rng.IntN(6) == 0 && !expose.WindowOf(r.Window).Smooth {
			r.Limit = max(0, r.Limit+int64(rng.IntN(3))-1)
		}
		n := pick(rng, int64(1), 1, 1, 2, 3)
		d.step(w, rng, r, at, n)
	}
	if r, ok := d.rule("smooth"); ok && rng.IntN(5) == 0 {
		// The rule's limit moved to 0: a denial writes limit_value 0.
		r = smoothRule(ut, expose.Interval(r.Window, r.Limit).Microseconds(), expose.WindowOf(r.Window).Burst, 0)
		d.step(w, rng, r, now.Add(-time.Duration(rng.Int64N(int64(time.Second)))), 1)
	}
	return d
}

// step carries out one check of r at at on the model.
func (d *drawnKey) step(w *world, rng *rand.Rand, r countlimit.Rule, at time.Time, n int64) {
	ctx := context.Background()
	var what string
	got, _ := w.call(at, func(l *countlimit.Limiter) {
		switch p := rng.IntN(10); {
		case expose.WindowOf(r.Window).Concurrent && (p < 6 || len(d.leases) == 0):
			what = "Acquire"
			if ls, res, err := l.Acquire(ctx, r, d.id); err == nil && res.Allowed {
				d.leases = append(d.leases, ls)
				d.taken[w.sent.Lease] = at.UnixMicro()
			}
		case expose.WindowOf(r.Window).Concurrent && p < 8:
			what = "Release"
			d.leases[rng.IntN(len(d.leases))].Release(ctx)
		case expose.WindowOf(r.Window).Concurrent:
			what = "Extend"
			d.leases[rng.IntN(len(d.leases))].Extend(ctx)
		case p < 8:
			what = fmt.Sprintf("AllowN(%d)", n)
			l.AllowN(ctx, r, d.id, n)
		default:
			what = fmt.Sprintf("Refund(%d)", n)
			l.Refund(ctx, r, d.id, n)
		}
	})
	d.how = append(d.how, fmt.Sprintf("%s %s limit %d %s", at.UTC().Format("2006-01-02T15:04:05.000000"), r.Window, r.Limit, what))
	d.wrote(got, w.key(d.ut, d.id))
}

// wrote records what request r (with the model's States, carried out on
// k) wrote of the row's columns that model.Key does not hold, as
// countlimit's statements write them: a row made by a check, or counted
// in, takes its kind, a smooth check's interval and burst, and every
// check that counts or is denied writes its limit.
func (d *drawnKey) wrote(r *driver.Request, k *model.Key) {
	created := !d.exists && !keystate.Empty(k)
	d.exists = !keystate.Empty(k)
	if r == nil || (r.Op != driver.OpAllow && r.Op != driver.OpAcquire) {
		return
	}
	c := &r.Checks[0]
	if created || (r.Op == driver.OpAllow && c.State.Allowed) {
		d.kind = nil
		if c.Kind != "" && r.Op == driver.OpAllow {
			d.kind = &c.Kind
		}
		if c.Smooth() {
			d.interval, d.burst = c.Interval.Microseconds(), c.Burst
		}
	}
	d.limit = c.Limit
}

// seed writes d's row (and leases) in tx, with the model's key.
func (w *world) seed(ctx context.Context, tx pgx.Tx, d *drawnKey) error {
	k := keystate.Clone(*w.key(d.ut, d.id))
	if err := seedRow(ctx, tx, d.ut, d.id, k, true); err != nil {
		return err
	}
	var interval *int64
	if d.interval > 0 {
		interval = &d.interval
	}
	var burst *int64
	if d.burst > 0 {
		burst = &d.burst
	}
	if _, err := tx.Exec(ctx, `UPDATE count_limit SET limit_value = $3, window_kind = $4,
			smooth_interval = $5 * interval '1 microsecond', smooth_burst = $6
		WHERE use_type = $1 AND unique_id = $2`, d.ut, d.id, d.limit, d.kind, interval, burst); err != nil {
		return err
	}
	for token, at := range d.taken {
		if _, err := tx.Exec(ctx, `UPDATE count_limit_lease SET taken_at = $4
			WHERE use_type = $1 AND unique_id = $2 AND lease_token = $3`, d.ut, d.id, token, time.UnixMicro(at)); err != nil {
			return err
		}
	}
	return nil
}
