//go:build fault

package faulttest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
)

const (
	callers      = 64                     // goroutines calling Allow in every phase
	idsPerCaller = 2                      // ids each caller owns and alone calls, in turn
	callTimeout  = 500 * time.Millisecond // each call's context deadline
	lateSlack    = 50 * time.Millisecond  // how late past its deadline a failed call may return
	maxRecovery  = time.Second            // from the server being back to the first success
	hotLimit     = 100                    // the Limit of the key every caller hammers
	warmUp       = 300 * time.Millisecond // load before a fault
	settle       = 500 * time.Millisecond // load after the last recovery
	errorPause   = 10 * time.Millisecond  // a caller's back-off after a failed call
)

var (
	// acctRule counts every call of an accounting id: its Limit is never
	// reached, and a Lifetime window never expires during the run.
	acctRule = countlimit.Rule{UseType: "fault.acct", Limit: expose.MaxLimit, Window: countlimit.Lifetime()}
	// hotRule is the exact limit every caller hammers, on one key per phase.
	hotRule = countlimit.Rule{UseType: "fault.limit", Limit: hotLimit, Window: countlimit.Lifetime()}
)

// target is a store under load and what the checks need to know of it.
type target struct {
	store   string
	limiter *countlimit.Limiter
	// counts reads the stored count of each id that has one.
	counts func(ctx context.Context, ut countlimit.UseType, ids []string) (map[string]int64, error)
	// maybeCounted reports whether a call that failed with err may have been
	// counted all the same (its reply was lost, or it ran after its caller
	// stopped waiting).
	maybeCounted func(err error) bool
	// maxRecovery is how soon after the server is back a call must
	// succeed: maxRecovery (the const) unless the client's own reconnect
	// policy says otherwise.
	maxRecovery time.Duration
}

// fault is one phase of a suite: load, a fault injected under it, recovery.
type fault struct {
	name string
	// keepsData is false for faults that lose the store's data (a Redis
	// restart): counts are then not compared.
	keepsData bool
	// noErrors demands that every call succeeds (SCRIPT FLUSH is handled
	// transparently), but those of held.
	noErrors bool
	// held names the caller and the id (of its idsPerCaller) whose row
	// inject holds locked from another transaction: its calls may wait out
	// their deadline with countlimit.ErrLocked, and are tallied apart
	// (the table's held column). Empty for other faults.
	held string
	// heldNew: held's id has no row until inject has another transaction
	// insert it (and hold it uncommitted); its caller calls it only from
	// then on (phase.heldLive).
	heldNew bool
	// inject breaks the store and mends it, calling p.back each time the
	// server is back, which waits for the first success after it.
	inject func(t *testing.T, p *phase)
}

// phase is the shared state of one fault's run.
type phase struct {
	target *target
	hotID  string
	heldID string // the id of fault.held, or ""
	// heldLive is set by inject once held's row is held (fault.heldNew):
	// until then its caller passes it by.
	heldLive, heldNew atomic.Bool

	stop    atomic.Bool
	hot     atomic.Bool // callers hammer hotID too
	armed   atomic.Bool // a recovery is being timed
	backAt  atomic.Int64
	firstOK atomic.Int64

	recoveries []time.Duration // written by inject's goroutine only; -1 = none in 5 s
	// schedLate is how late a 5 ms sleep woke at worst during the phase:
	// the scheduling noise a late call's figure includes.
	schedLate atomic.Int64
}

// probe measures scheduling noise until the phase stops.
func (p *phase) probe() {
	const d = 5 * time.Millisecond
	for !p.stop.Load() {
		start := time.Now()
		time.Sleep(d)
		if late := int64(time.Since(start) - d); late > p.schedLate.Load() {
			p.schedLate.Store(late)
		}
	}
}

// back marks the server as back now and waits, up to 5 s, for the first
// successful call that ends after this moment.
func (p *phase) back() {
	at := time.Now()
	p.firstOK.Store(0)
	p.backAt.Store(at.UnixNano())
	p.armed.Store(true)
	deadline := at.Add(5 * time.Second)
	for p.firstOK.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	p.armed.Store(false)
	rec := time.Duration(-1)
	if first := p.firstOK.Load(); first != 0 {
		rec = time.Duration(first - at.UnixNano())
	}
	p.recoveries = append(p.recoveries, rec)
}

func (p *phase) succeeded() {
	if !p.armed.Load() {
		return
	}
	now := time.Now().UnixNano()
	if now >= p.backAt.Load() {
		p.firstOK.CompareAndSwap(0, now)
	}
}

// idState is what one caller knows of one of its ids.
type idState struct {
	id      string
	acked   int64 // successful calls, all Allowed
	unknown int64 // failed calls that may have been counted
	// excess is the most Used ever exceeded acked+unknown (counted twice)
	// and short is the most it fell below acked (an acknowledged count
	// lost), both as seen in the Results themselves.
	excess, short int64
}

// tally is one caller's record of a phase.
type tally struct {
	ids                  []*idState
	calls, ok, failed    int
	unknown              int
	late                 int
	maxFail              time.Duration
	notUnavailableN      int      // failed calls whose error is not ErrUnavailable
	notUnavailable       []string // the first few of their errors
	deadlineNotUnavail   int
	denied               int // an accounting call denied: its Limit is never reached
	errs                 map[string]int
	hotAcked, hotUnknown int64
	panicked             string
	deadlineUnavail      int // failures that carry both ErrUnavailable and DeadlineExceeded
	held                 int // failed calls of the held id, all ErrLocked
}

func (p *phase) work(tl *tally) {
	defer func() {
		if r := recover(); r != nil {
			tl.panicked = fmt.Sprintf("%v\n%s", r, debug.Stack())
		}
	}()
	for i := 0; !p.stop.Load(); i++ {
		st := tl.ids[i%len(tl.ids)]
		if st.id == p.heldID && p.heldNew.Load() && !p.heldLive.Load() {
			continue
		}
		res, err := p.call(tl, acctRule, st.id)
		failed := err != nil
		switch {
		case err != nil:
			if p.target.maybeCounted(err) {
				st.unknown++
				tl.unknown++
			}
		case !res.Allowed:
			tl.denied++
		default:
			st.acked++
			if e := res.Used - st.acked - st.unknown; e > st.excess {
				st.excess = e
			}
			if s := st.acked - res.Used; s > st.short {
				st.short = s
			}
		}
		if p.hot.Load() {
			res, err := p.call(tl, hotRule, p.hotID)
			switch {
			case err != nil:
				failed = true
				if p.target.maybeCounted(err) {
					tl.hotUnknown++
				}
			case res.Allowed:
				tl.hotAcked++
			}
		}
		if failed {
			time.Sleep(errorPause)
		}
	}
}

// call makes one Allow with its own deadline and checks how it failed.
func (p *phase) call(tl *tally, r countlimit.Rule, id string) (countlimit.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	start := time.Now()
	res, err := p.target.limiter.Allow(ctx, r, id)
	took := time.Since(start)
	cancel()
	tl.calls++
	if err == nil {
		tl.ok++
		p.succeeded()
		return res, nil
	}
	if id == p.heldID && errors.Is(err, countlimit.ErrLocked) {
		tl.held++
	} else {
		tl.failed++
	}
	tl.maxFail = max(tl.maxFail, took)
	if took > callTimeout+lateSlack {
		tl.late++
	}
	deadline := errors.Is(err, context.DeadlineExceeded)
	if errors.Is(err, countlimit.ErrUnavailable) {
		if deadline {
			tl.deadlineUnavail++
		}
	} else {
		tl.notUnavailableN++
		if len(tl.notUnavailable) < 3 {
			tl.notUnavailable = append(tl.notUnavailable, err.Error())
		}
		if deadline {
			tl.deadlineNotUnavail++
		}
	}
	msg := err.Error()
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	if _, ok := tl.errs[msg]; ok || len(tl.errs) < 8 {
		tl.errs[msg]++
	}
	return res, err
}

// run puts the load on tg, injects f under it, and checks what happened.
func run(t *testing.T, tg *target, f fault) {
	t.Run(f.name, func(t *testing.T) {
		p := &phase{target: tg, hotID: tg.store + "-" + f.name}
		if f.held != "" {
			p.heldID = tg.store + "-" + f.name + "/" + f.held
			p.heldNew.Store(f.heldNew)
		}
		tallies := make([]*tally, callers)
		var wg sync.WaitGroup
		for w := range callers {
			tl := &tally{errs: map[string]int{}}
			for k := range idsPerCaller {
				tl.ids = append(tl.ids, &idState{id: fmt.Sprintf("%s-%s/%s", tg.store, f.name, heldName(w, k))})
			}
			tallies[w] = tl
			wg.Go(func() { p.work(tl) })
		}
		wg.Go(p.probe)
		stopAll := func() {
			p.stop.Store(true)
			wg.Wait()
		}
		defer stopAll() // when inject fails the test
		start := time.Now()
		time.Sleep(warmUp)
		p.hot.Store(true)
		f.inject(t, p)
		time.Sleep(settle)
		stopAll()
		took := time.Since(start)
		// A call abandoned at its deadline may still be running on the
		// server (a group commit, a command queued behind CLIENT PAUSE).
		time.Sleep(300 * time.Millisecond)
		check(t, p, f, tallies, took)
	})
}

// heldName is the name of caller w's k-th id within a fault's ids, as
// fault.held spells it.
func heldName(w, k int) string { return fmt.Sprintf("c%02d/%d", w, k) }

// figures is one row of the results table.
type figures struct {
	store, fault     string
	took             time.Duration
	calls, failed    int
	held             int // failed calls of fault.held's id (ErrLocked); -1 without one
	late, notUnavail int
	checked          bool // counts were compared
	lost, double     int64
	hotAcked         int64
	hotStored        int64
	maxFail          time.Duration
	schedLate        time.Duration
	recoveries       []time.Duration
}

var (
	tableMu sync.Mutex
	table   []figures
)

func check(t *testing.T, p *phase, f fault, tallies []*tally, took time.Duration) {
	t.Helper()
	fg := figures{store: p.target.store, fault: f.name, took: took, checked: f.keepsData, recoveries: p.recoveries, hotStored: -1,
		schedLate: time.Duration(p.schedLate.Load()), held: -1}
	if f.held != "" {
		fg.held = 0
	}
	var (
		ids       []*idState
		notUnav   []string
		deadline  int
		denied    int
		unknown   int
		hotUnk    int64
		errs      = map[string]int{}
		panicked  []string
		dlUnavail int
	)
	for _, tl := range tallies {
		ids = append(ids, tl.ids...)
		fg.calls += tl.calls
		fg.failed += tl.failed
		if f.held != "" {
			fg.held += tl.held
		}
		fg.late += tl.late
		fg.notUnavail += tl.notUnavailableN
		fg.maxFail = max(fg.maxFail, tl.maxFail)
		fg.hotAcked += tl.hotAcked
		notUnav = append(notUnav, tl.notUnavailable...)
		deadline += tl.deadlineNotUnavail
		dlUnavail += tl.deadlineUnavail
		denied += tl.denied
		unknown += tl.unknown
		hotUnk += tl.hotUnknown
		for m, n := range tl.errs {
			errs[m] += n
		}
		if tl.panicked != "" {
			panicked = append(panicked, tl.panicked)
		}
	}
	for _, s := range panicked {
		t.Errorf("a caller panicked: %s", s)
	}
	if fg.notUnavail > 0 {
		t.Errorf("%d failed calls are not ErrUnavailable (%d of them are context.DeadlineExceeded), e.g. %q", fg.notUnavail, deadline, first(notUnav, 3))
	}
	if fg.late > 0 {
		t.Errorf("%d failed calls returned more than %v after their %v deadline (slowest %v; a 5 ms sleep woke up to %v late meanwhile)",
			fg.late, lateSlack, callTimeout, fg.maxFail.Round(time.Millisecond), fg.schedLate.Round(time.Millisecond))
	}
	if f.noErrors && fg.failed > 0 {
		t.Errorf("%d of %d calls failed, want none; errors: %v", fg.failed, fg.calls, topErrors(errs, 3))
	}
	if f.held != "" {
		t.Logf("the held id %s: %d calls failed with ErrLocked", p.heldID, fg.held)
	}
	if denied > 0 {
		t.Errorf("%d accounting calls were denied, but their Limit is never reached", denied)
	}
	for i, r := range p.recoveries {
		switch {
		case r < 0:
			t.Errorf("recovery %d: no call succeeded within 5 s of the server being back", i+1)
		case r > cmp.Or(p.target.maxRecovery, maxRecovery):
			t.Errorf("recovery %d: the first success came %v after the server was back, want ≤ %v", i+1, r.Round(time.Millisecond), cmp.Or(p.target.maxRecovery, maxRecovery))
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if f.keepsData {
		names := make([]string, len(ids))
		for i, s := range ids {
			names[i] = s.id
		}
		stored, err := p.target.counts(ctx, acctRule.UseType, names)
		if err != nil {
			t.Fatalf("reading stored counts: %v", err)
		}
		var seenExcess, seenShort int64
		var worst []string
		for _, s := range ids {
			n := stored[s.id]
			if n < s.acked {
				fg.lost += s.acked - n
				worst = append(worst, fmt.Sprintf("%s: stored %d < acknowledged %d", s.id, n, s.acked))
			}
			if n > s.acked+s.unknown {
				fg.double += n - s.acked - s.unknown
				worst = append(worst, fmt.Sprintf("%s: stored %d > acknowledged %d + failed %d", s.id, n, s.acked, s.unknown))
			}
			seenExcess += s.excess
			seenShort += s.short
		}
		if fg.lost > 0 {
			t.Errorf("%d acknowledged allowances are not stored (lost), want 0; e.g. %v", fg.lost, first(worst, 3))
		}
		if fg.double > 0 {
			t.Errorf("%d counts stored beyond acknowledged + failed calls (double counts), want 0; e.g. %v", fg.double, first(worst, 3))
		}
		if seenExcess > 0 {
			t.Errorf("Results skipped %d numbers: an id's Used exceeded its caller's acknowledged + failed calls (double counts seen by the caller), want 0", seenExcess)
		}
		if seenShort > 0 {
			t.Errorf("Results fell %d below acknowledged calls: an id's Used went below what its caller had been granted, want 0", seenShort)
		}

		hot, err := p.target.counts(ctx, hotRule.UseType, []string{p.hotID})
		if err != nil {
			t.Fatalf("reading the limited key: %v", err)
		}
		fg.hotStored = hot[p.hotID]
		switch {
		case fg.hotStored > hotLimit:
			t.Errorf("the Limit %d key stores %d", hotLimit, fg.hotStored)
		case fg.hotStored < fg.hotAcked:
			t.Errorf("the Limit %d key stores %d, fewer than the %d allowances acknowledged (lost)", hotLimit, fg.hotStored, fg.hotAcked)
		case fg.hotStored > fg.hotAcked+hotUnk:
			t.Errorf("the Limit %d key stores %d, more than %d acknowledged + %d failed calls (double counts)", hotLimit, fg.hotStored, fg.hotAcked, hotUnk)
		}
	}
	if f.keepsData && fg.hotAcked > hotLimit {
		t.Errorf("the Limit %d key acknowledged %d allowances", hotLimit, fg.hotAcked)
	}
	t.Logf("%d calls, %d failed (%d may have been counted; %d were ErrUnavailable and DeadlineExceeded); errors: %v",
		fg.calls, fg.failed, unknown, dlUnavail, topErrors(errs, 4))
	t.Logf("\n%s%s", header(), fg.row())
	tableMu.Lock()
	table = append(table, fg)
	tableMu.Unlock()
}

// topErrors returns the n most frequent error messages with their counts.
func topErrors(errs map[string]int, n int) []string {
	msgs := slices.Collect(maps.Keys(errs))
	slices.SortFunc(msgs, func(a, b string) int { return cmp.Or(errs[b]-errs[a], strings.Compare(a, b)) })
	out := make([]string, 0, n)
	for _, m := range first(msgs, n) {
		out = append(out, fmt.Sprintf("%d× %s", errs[m], m))
	}
	return out
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

func header() string {
	return fmt.Sprintf("%-8s %-11s %6s %7s %6s %5s %4s %6s %5s %6s %9s %8s %6s  %s\n",
		"store", "fault", "time", "calls", "failed", "held", "late", "!unav", "lost", "double", "limit100", "max-fail", "sched", "recovery (max of n)")
}

func (f figures) row() string {
	lost, double, limit := "-", "-", fmt.Sprintf("%d/-", f.hotAcked)
	if f.checked {
		lost, double = fmt.Sprint(f.lost), fmt.Sprint(f.double)
		limit = fmt.Sprintf("%d/%d", f.hotAcked, f.hotStored)
	}
	rec := "-"
	if len(f.recoveries) > 0 {
		worst := slices.Max(f.recoveries)
		if slices.Contains(f.recoveries, -1) {
			rec = fmt.Sprintf("none in 5 s (of %d)", len(f.recoveries))
		} else {
			rec = fmt.Sprintf("%v (of %d)", worst.Round(time.Millisecond), len(f.recoveries))
		}
	}
	held := "-"
	if f.held >= 0 {
		held = fmt.Sprint(f.held)
	}
	return fmt.Sprintf("%-8s %-11s %5.1fs %7d %6d %5s %4d %6d %5s %6s %9s %8v %6v  %s\n",
		f.store, f.fault, f.took.Seconds(), f.calls, f.failed, held, f.late, f.notUnavail, lost, double, limit,
		f.maxFail.Round(time.Millisecond), f.schedLate.Round(time.Millisecond), rec)
}

// printTable prints every phase's figures, for TestMain to show at the end.
func printTable() {
	tableMu.Lock()
	defer tableMu.Unlock()
	if len(table) == 0 {
		return
	}
	var b strings.Builder
	b.WriteString("\nfault suite figures (limit100 = acknowledged/stored on the Limit 100 key; lost and double from stored counts;\n" +
		"held = calls of the id another transaction held locked, which waited out their deadline (ErrLocked), not in failed;\n" +
		"sched = how late a 5 ms sleep woke at worst, the scheduling noise in max-fail):\n")
	b.WriteString(header())
	for _, f := range table {
		b.WriteString(f.row())
	}
	fmt.Fprint(os.Stdout, b.String())
}

// checkGoroutines waits up to 5 s for the goroutine count to fall back to
// base (plus a little slack for the runtime and testing package).
func checkGoroutines(t *testing.T, base int) {
	t.Helper()
	const slack = 2
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base+slack {
			t.Logf("goroutines: %d after closing, baseline %d", n, base)
			return
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Errorf("goroutines: %d 5 s after closing, want ≤ %d (baseline %d + %d):\n%s", n, base+slack, base, slack, b.String())
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// baseline is the phase without a fault: the harness's own sanity check.
var baseline = fault{name: "none", keepsData: true, noErrors: true, inject: func(*testing.T, *phase) { time.Sleep(time.Second) }}

func TestMain(m *testing.M) {
	code := m.Run()
	printTable()
	os.Exit(code)
}
