package modeltest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// Inspector reads and writes a store's state of one key directly, in the
// terms of model.Key, so that RunContract can check what a store keeps,
// not only the Results it gives. A store's test package writes one for its
// store (with SQL, HSET or a hook into its memory).
type Inspector struct {
	// Read returns what the store keeps of (useType, id): the zero Key
	// when it keeps nothing.
	Read func(ctx context.Context, useType, id string) (model.Key, error)
	// Seed makes the store keep k for (useType, id), replacing what it
	// kept. k.End is model.Forever for a lifetime window.
	Seed func(ctx context.Context, useType, id string, k model.Key) error
}

// RunContract checks store against the contract's reference model,
// model.Apply, one request at a time: each case seeds a key's state,
// calls store.Do directly with a request, and demands the States Apply
// gives and the stored state Apply leaves (count and window, sliding log,
// denial tally, penalty and leases). A store that gives the right Results
// but keeps the wrong state fails here.
func RunContract(t *testing.T, store driver.Store, in Inspector) {
	t.Helper()
	for _, c := range contractCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ut := string(storetest.UseType(t, "contract"))
			want := keystate.Clone(c.seed)
			if err := in.Seed(ctx, ut, "id", keystate.Clone(c.seed)); err != nil {
				t.Fatalf("seeding %+v: %v", c.seed, err)
			}
			got, ref := c.req(ut), c.req(ut)
			model.Apply(ref, []*model.Key{&want})
			if err := store.Do(ctx, got); err != nil {
				t.Fatalf("Do: %v", err)
			}
			for i := range got.Checks {
				if g, w := stateText(got.Checks[i].State), stateText(ref.Checks[i].State); g != w {
					t.Errorf("%s from %+v: State %s, want %s (model.Apply)", c.name, c.seed, g, w)
				}
			}
			k, err := in.Read(ctx, ut, "id")
			if err != nil {
				t.Fatal(err)
			}
			if g, w := keyText(k, c.span, got.Now.UnixMicro()), keyText(want, c.span, got.Now.UnixMicro()); g != w {
				t.Errorf("%s from %+v: the store keeps %s, want %s (model.Apply)", c.name, c.seed, g, w)
			}
		})
	}
}

type contractCase struct {
	name string
	seed model.Key
	span int64 // the sliding rule's, in µs, for the live part of a log
	req  func(useType string) *driver.Request
}

func contractCases() []contractCase {
	now := time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC)
	us := func(d time.Duration) int64 { return now.Add(d).UnixMicro() }
	fixed := func(op driver.Op, n, limit int64, block time.Duration) func(string) *driver.Request {
		return func(ut string) *driver.Request {
			begin := now.Truncate(time.Hour)
			return &driver.Request{Op: op, ID: "id", Now: now, N: n, Checks: []driver.Check{{
				UseType: ut, Limit: limit, Begin: begin, End: begin.Add(time.Hour), Block: block}}}
		}
	}
	sliding := func(op driver.Op, n, limit int64) func(string) *driver.Request {
		return func(ut string) *driver.Request {
			return &driver.Request{Op: op, ID: "id", Now: now, N: n, Checks: []driver.Check{{
				UseType: ut, Limit: limit, Span: time.Minute}}}
		}
	}
	slot := func(op driver.Op, token string, limit int64) func(string) *driver.Request {
		return func(ut string) *driver.Request {
			return &driver.Request{Op: op, ID: "id", Now: now, N: 1, Lease: token, Checks: []driver.Check{{
				UseType: ut, Limit: limit, TTL: time.Minute, Block: time.Hour}}}
		}
	}
	window := func(count int64, begin, end time.Duration) model.Key {
		return model.Key{Count: count, Begin: us(begin), End: us(end)}
	}
	// 10 a second (one every 100ms) with bursts of 3.
	smooth := func(op driver.Op, n, limit int64, block time.Duration) func(string) *driver.Request {
		return func(ut string) *driver.Request {
			return &driver.Request{Op: op, ID: "id", Now: now, N: n, Checks: []driver.Check{{
				UseType: ut, Limit: limit, Interval: 100 * time.Millisecond, Burst: 3, Block: block, Kind: "smooth"}}}
		}
	}
	// A smooth key as a smooth check leaves it: its TAT, and its units
	// not yet drained (at most the burst) over [0, TAT).
	tat := func(d time.Duration) model.Key {
		return model.Key{Count: int64(min(3, max(0, (d+99*time.Millisecond)/(100*time.Millisecond)))), End: us(d), TAT: us(d)}
	}
	tok := func(c byte) string { return string(slices.Repeat([]byte{c}, 22)) }
	return []contractCase{
		{name: "AllowCountsInTheCurrentWindow", seed: window(2, -10*time.Minute, 50*time.Minute), req: fixed(driver.OpAllow, 1, 5, 0)},
		{name: "AllowOpensAFreshWindowOverAStaleOne", seed: window(5, -2*time.Hour, -time.Hour), req: fixed(driver.OpAllow, 2, 5, 0)},
		{name: "AWindowThatBeginsLaterIsCurrent", seed: window(3, time.Minute, time.Hour), req: fixed(driver.OpAllow, 1, 5, 0)},
		{name: "AnEmptyWindowIsNotCurrent", seed: window(4, 0, 0), req: fixed(driver.OpAllow, 1, 5, 0)},
		{name: "ADenialIsTallied", seed: model.Key{Count: 5, Begin: us(-time.Minute), End: us(time.Minute), Denied: 7}, req: fixed(driver.OpAllow, 1, 5, 0)},
		{name: "ADenialOfANewKeyIsTallied", req: fixed(driver.OpAllow, 3, 2, 0)},
		{name: "ADenialSetsThePenalty", seed: window(5, -time.Minute, time.Minute), req: fixed(driver.OpAllow, 1, 5, time.Hour)},
		{name: "APenaltyIsNotExtended", seed: model.Key{Count: 1, Begin: us(-time.Minute), End: us(time.Minute), Blocked: us(time.Second), Denied: 1},
			req: fixed(driver.OpAllow, 1, 5, time.Hour)},
		{name: "APenaltyThatEndedIsOver", seed: model.Key{Count: 1, Begin: us(-time.Minute), End: us(time.Minute), Blocked: us(0)},
			req: fixed(driver.OpAllow, 1, 5, time.Hour)},
		{name: "PeekWritesNothing", seed: window(5, -time.Minute, time.Minute), req: fixed(driver.OpPeek, 1, 5, time.Hour)},
		{name: "RefundNeverBelowZero", seed: window(2, -time.Minute, time.Minute), req: fixed(driver.OpRefund, 5, 5, 0)},
		{name: "RefundOfAStaleWindowDoesNothing", seed: window(2, -time.Hour, -time.Minute), req: fixed(driver.OpRefund, 1, 5, 0)},
		{name: "ResetForgetsEverything", seed: model.Key{Count: 2, Begin: us(-time.Minute), End: us(time.Minute), Denied: 3, Blocked: us(time.Hour)},
			req: fixed(driver.OpReset, 1, 5, 0)},
		{name: "LifetimeCounts", seed: model.Key{Count: 4, Begin: us(-time.Hour), End: model.Forever}, req: fixed(driver.OpAllow, 1, 5, 0)},
		{name: "SlidingLogsInOrderAndDropsWhatLeft", span: time.Minute.Microseconds(),
			seed: model.Key{Log: []int64{us(-2 * time.Minute), us(-30 * time.Second), us(time.Second)}}, req: sliding(driver.OpAllow, 2, 5)},
		{name: "SlidingDenialNamesWhenRoomComes", span: time.Minute.Microseconds(),
			seed: model.Key{Log: []int64{us(-40 * time.Second), us(-20 * time.Second)}}, req: sliding(driver.OpAllow, 2, 3)},
		{name: "SlidingRefundDropsTheNewest", span: time.Minute.Microseconds(),
			seed: model.Key{Log: []int64{us(-40 * time.Second), us(-20 * time.Second), us(-10 * time.Second)}}, req: sliding(driver.OpRefund, 2, 5)},
		{name: "CountingAWindowDropsASlidingLog", span: time.Minute.Microseconds(),
			seed: model.Key{Count: 2, Begin: us(-30 * time.Second), End: us(40 * time.Second), Log: []int64{us(-30 * time.Second), us(-20 * time.Second)}},
			req:  fixed(driver.OpAllow, 1, 5, 0)},
		{name: "AcquireDropsExpiredLeases", seed: model.Key{Leases: map[string]int64{tok('A'): us(-time.Second), tok('B'): us(time.Second)}},
			req: slot(driver.OpAcquire, tok('C'), 2)},
		{name: "AcquireDenialIsTalliedAndBlocks", seed: model.Key{Leases: map[string]int64{tok('A'): us(time.Second), tok('B'): us(2 * time.Second)}},
			req: slot(driver.OpAcquire, tok('C'), 2)},
		{name: "ReleaseOfAnExpiredLeaseFreesNothing", seed: model.Key{Leases: map[string]int64{tok('A'): us(0), tok('B'): us(time.Second)}},
			req: slot(driver.OpRelease, tok('A'), 2)},
		{name: "ExtendMovesTheExpiry", seed: model.Key{Leases: map[string]int64{tok('A'): us(time.Second)}}, req: slot(driver.OpExtend, tok('A'), 2)},
		{name: "SmoothAllowsFromNowOnADrainedKey", seed: tat(-time.Second), req: smooth(driver.OpAllow, 2, 10, 0)},
		{name: "SmoothAllowMovesTheInstant", seed: tat(150 * time.Millisecond), req: smooth(driver.OpAllow, 1, 10, 0)},
		{name: "SmoothFitsExactlyAtTheBurst", seed: tat(200 * time.Millisecond), req: smooth(driver.OpAllow, 1, 10, 0)},
		{name: "SmoothDenialNamesWhenItFits", seed: withDenied(tat(250*time.Millisecond), 2), req: smooth(driver.OpAllow, 2, 10, 0)},
		{name: "SmoothDenialSetsThePenalty", seed: tat(300 * time.Millisecond), req: smooth(driver.OpAllow, 1, 10, time.Hour)},
		{name: "SmoothMoreThanTheBurstNeverFits", req: smooth(driver.OpAllow, 4, 10, 0)},
		{name: "SmoothLimitZeroNeverFits", req: smooth(driver.OpAllow, 1, 0, time.Minute)},
		{name: "SmoothPeekWritesNothing", seed: tat(300 * time.Millisecond), req: smooth(driver.OpPeek, 1, 10, time.Hour)},
		{name: "SmoothRefundMovesTheInstantBack", seed: tat(250 * time.Millisecond), req: smooth(driver.OpRefund, 1, 10, 0)},
		{name: "SmoothRefundNeverBeforeNow", seed: tat(250 * time.Millisecond), req: smooth(driver.OpRefund, 5, 10, 0)},
		{name: "SmoothResetForgetsTheInstant", seed: model.Key{TAT: us(time.Second), Count: 3, End: us(time.Second), Denied: 1, Blocked: us(time.Hour)},
			req: smooth(driver.OpReset, 1, 10, 0)},
		{name: "SmoothCarriesALogOver", span: time.Minute.Microseconds(),
			seed: model.Key{Count: 2, Begin: us(-30 * time.Second), End: us(40 * time.Second), Log: []int64{us(-30 * time.Second), us(-20 * time.Second)}},
			req:  smooth(driver.OpAllow, 1, 10, 0)},
		{name: "SmoothCarriesAWindowOver", seed: window(1, -time.Minute, time.Minute), req: smooth(driver.OpAllow, 2, 10, 0)},
		{name: "SmoothCarriesAFullBurstUntilTheWindowEnds", seed: window(5, -time.Minute, time.Minute), req: smooth(driver.OpAllow, 1, 10, 0)},
		{name: "SmoothCarriesALifetimeCountForever", seed: model.Key{Count: 3, Begin: us(-time.Hour), End: model.Forever}, req: smooth(driver.OpAllow, 1, 10, 0)},
		{name: "SmoothCarriesNothingOfAStaleWindow", seed: window(5, -time.Hour, -time.Minute), req: smooth(driver.OpAllow, 3, 10, 0)},
		{name: "SmoothRefundLeavesAWindow", seed: window(2, -time.Minute, time.Minute), req: smooth(driver.OpRefund, 1, 10, 0)},
		{name: "CountingAWindowJoinsASmoothKey", seed: tat(time.Minute), req: fixed(driver.OpAllow, 1, 5, 0)},
		{name: "RefundOfAWindowLeavesTheSmoothInstant", seed: tat(250 * time.Millisecond), req: fixed(driver.OpRefund, 1, 5, 0)},
		{name: "SlidingCarriesAWindowOverAtTheChange", span: time.Minute.Microseconds(), seed: window(2, -time.Minute, time.Hour), req: sliding(driver.OpAllow, 2, 5)},
		{name: "SlidingCarriesAWindowOverUntilItsEnd", span: time.Minute.Microseconds(), seed: window(2, -time.Minute, 10*time.Second), req: sliding(driver.OpAllow, 2, 5)},
		{name: "SlidingDenialOfACarriedCountWaitsForItsWindow", span: time.Minute.Microseconds(), seed: window(4, -time.Minute, time.Hour), req: sliding(driver.OpAllow, 2, 5)},
		{name: "SlidingCarriesASmoothKeyOver", span: time.Minute.Microseconds(), seed: tat(250 * time.Millisecond), req: sliding(driver.OpAllow, 1, 5)},
		{name: "SlidingCarriesALifetimeCountForever", span: time.Minute.Microseconds(), seed: model.Key{Count: 5, Begin: us(-time.Hour), End: model.Forever}, req: sliding(driver.OpAllow, 1, 5)},
		{name: "SlidingCarriesNothingOfAnEmptiedWindow", span: time.Minute.Microseconds(), seed: window(0, -time.Minute, time.Hour), req: sliding(driver.OpPeek, 1, 5)},
		{name: "SlidingRefundLeavesAWindow", span: time.Minute.Microseconds(), seed: window(3, -time.Minute, time.Hour), req: sliding(driver.OpRefund, 1, 5)},
		{name: "ASmoothDenialLeavesAWindow", seed: window(2, -time.Minute, time.Minute), req: smooth(driver.OpAllow, 4, 10, 0)},
		{name: "LeasesAndCountsAreApart", seed: model.Key{Count: 2, Begin: us(-time.Minute), End: us(time.Minute), Leases: map[string]int64{tok('A'): us(time.Second)}},
			req: slot(driver.OpPeek, "", 1)},
	}
}

func withDenied(k model.Key, n int64) model.Key {
	k.Denied = n
	return k
}

func stateText(s driver.State) string {
	t := func(v time.Time) string {
		if v.IsZero() {
			return "-"
		}
		return v.UTC().Format("15:04:05.000000")
	}
	return fmt.Sprintf("{allowed %v used %d [%s, %s) blocked %s free %s}", s.Allowed, s.Used, t(s.Begin), t(s.End), t(s.BlockedUntil), t(s.FreeAt))
}

// keyText is what must be equal of a key's stored state at now: a sliding
// log and the leases by what is live, a window only when it is not empty,
// a smooth instant only when it is after now.
func keyText(k model.Key, span, now int64) string {
	k = keystate.Live(k, span, now)
	window := "none"
	if k.Begin < k.End {
		window = fmt.Sprintf("%d [%d, %d)", k.Count, k.Begin, k.End)
	}
	tat := "none"
	if k.TAT > now {
		tat = fmt.Sprint(k.TAT)
	}
	return fmt.Sprintf("{window %s log %v tat %s denied %d blocked %d leases %v}", window, k.Log, tat, k.Denied, k.Blocked, leaseText(k.Leases, 4))
}

// leaseText lists leases as "token@expiry", sorted, each token cut to
// width characters.
func leaseText(leases map[string]int64, width int) []string {
	var out []string
	for t, e := range leases {
		out = append(out, fmt.Sprintf("%.*s@%d", width, t, e))
	}
	slices.Sort(out)
	return out
}
