// Package driver is what a countlimit store implements, beside package
// countlimit as database/sql/driver stands beside database/sql: the Store
// interface and its contract and the Request a Limiter hands a store.
// Business code uses package countlimit and a store's New; only a
// store's writer needs this package.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit/internal/errs"
)

// Unavailable wraps a store's error so that errors.Is(err,
// countlimit.ErrUnavailable) holds: every call a store could not carry out
// (it cannot be reached, it failed, or the context ended first) fails with
// it, and errors.As still finds the cause. A nil err stays nil, and so
// does an error that wraps countlimit.ErrInvalid (a refusal, not a
// failure).
func Unavailable(err error) error {
	if err == nil || errors.Is(err, errs.ErrUnavailable) || errors.Is(err, errs.ErrInvalid) {
		return err
	}
	return fmt.Errorf("%w: %w", errs.ErrUnavailable, err)
}

// Store keeps counters and applies checks to them atomically. The stores of
// this module are memstore, pgstore and redisstore; storetest.Run proves a
// Store meets the contract below, and the module's reference model
// (internal/testkit/model) spells it out as code.
//
// A Store holds no policy: the Limiter validates input, reads its clock and
// turns each rule into explicit bounds before calling Do, and turns the
// State a store reports into a Result. A Store does storage and atomicity.
//
// Do carries out r atomically and writes each Check's State. A store may
// gather concurrent calls into one round trip (pipelining, group commit);
// each still gets the State it would have had alone. When Do returns an
// error, it must wrap countlimit.ErrUnavailable (see [Unavailable]),
// unless the store refused r, having written nothing, because it does not
// support a kind of window of r (see [Request.Smooth]): that error wraps
// countlimit.ErrInvalid instead. Implementations
// must be safe for concurrent use and must not keep r after returning.
//
// The semantics of one Request, for each Check c (one per rule, all with
// the same ID; no two Checks of a Request share a UseType, which the
// Limiter ensures and stores may rely on):
//
//   - The stored window of (c.UseType, req.ID) is current when it is not
//     empty (Begin < End, a zero End meaning it never ends) and Now < End.
//     Begin is not compared with Now: a caller whose clock read is older
//     than a window another caller has just opened joins that window, so
//     concurrent callers never reset each other's counts. A Sliding check
//     instead keeps its log of event times e with e > Now - c.Span, in time
//     order whatever order callers arrive in. Otherwise the check sees a
//     fresh window [c.Begin, c.End) with nothing counted.
//   - One count per (use type, id), whatever kind of window asks: a key is
//     kept in the form of the kind that last counted in it (a window's
//     count, a sliding log, a smooth instant), and every form keeps a
//     window and a count besides (a log: its length over [oldest, newest +
//     its Span), as last written; a smooth key: its units not yet drained
//     when last written, over [0, TAT)). A check of another kind carries
//     that count over, as if its events had all been counted at Now under
//     its own rule: a check that counts in windows joins the window while
//     it is current; a Sliding check whose key has no log sees Count
//     events logged at Now while the window is current; a Smooth check
//     whose key has no TAT sees min(Count, c.Burst) units taken at Now
//     (TAT = Now + that many intervals). A change of a rule's kind so
//     never starts from zero.
//   - The check is blocked when its stored BlockedUntil is after Now; it fits
//     when it is not blocked and Used + N <= c.Limit.
//   - OpAllow: if every check fits, each counts N (a stale window is replaced
//     by [c.Begin, c.End); a sliding check logs N events at Now, and its
//     window becomes [oldest, newest + Span), the log holding what the
//     check saw and the N new ones) and Allowed is true. Counting writes
//     the key in the check's own form: a count clears the log and the TAT,
//     a log clears the TAT. Otherwise nothing is counted anywhere, Allowed is
//     false, and each check that does not fit adds 1 to its denied tally; if
//     it was not blocked and c.Block > 0, it is blocked until Now + c.Block.
//     A denial leaves the window as it was, and creates no state for a
//     check that fits.
//   - OpPeek: like OpAllow with N = 1, but writes nothing.
//   - OpRefund: each check's current window gives back N, never below 0 (a
//     sliding check drops its N newest events), in the form the key is
//     kept in: a sliding check gives back nothing of a key that has no log,
//     and a check that counts in windows lowers the count of whatever
//     window is current, leaving a log or a TAT as it is; then Allowed is
//     computed as for OpPeek.
//   - OpReset: forgets every check's state, penalty included: its count,
//     its sliding log, its smooth instant and its leases (below), whatever
//     the check's kind.
//
// A Smooth check (Interval > 0) is decided by GCRA, as go-redis/redis_rate
// decides, and keeps one instant instead of a count: TAT (the theoretical
// arrival time), when the key is fully drained; a key with
// none, or with TAT at or before Now, is drained. Let T = c.Interval, B =
// c.Burst and tat = max(TAT, Now). Times are whole microseconds, as
// everywhere here. Compared as differences from Now (tat - Now + N*T <=
// B*T), every quantity stays within 100 years, under 2^53 (the Limiter
// keeps B*T within 100 years, and N is multiplied only once N <= B), so a
// Redis script computes it exactly in doubles.
//
//   - The check fits when it is not blocked, c.Limit > 0, N <= B and
//     tat + N*T - B*T <= Now: after N more units, no more than B are
//     undrained. A check with Limit 0 never fits.
//   - OpAllow: if every check of the request fits, TAT becomes tat + N*T,
//     and the key a smooth key: Count is its State's Used, the window [0,
//     TAT), no log. A denial changes nothing but the denial tally and the
//     penalty, as for other kinds.
//   - OpPeek: like OpAllow with N = 1, writing nothing.
//   - OpRefund: TAT goes back N*T, never before Now (a drained key stays
//     as it is), and Count and End follow it (the units undrained, TAT);
//     a key with no TAT gives back nothing. Then Allowed as for OpPeek.
//
// Its State after the request: Used is ceil((TAT-Now)/T), the units not
// yet drained, between 0 and B; Begin is zero; End is TAT when it is after
// Now, else zero; FreeAt, when the check itself does not fit (blocked or
// not) but could (Limit > 0, N <= B), is tat + N*T - B*T: the instant N
// more fit, so that the wait is exact; zero otherwise. BlockedUntil and
// Allowed are as for every check.
//
// A Concurrent check (TTL > 0) keeps leases instead of a count: each lease
// is a token (Request.Lease) with an expiry, and is live while Now is before
// its expiry. Its Used is the number of live leases; expired ones may be
// dropped by any write. Such a check is always the only check of its
// Request, with N = 1, and comes only with these operations:
//
//   - OpAcquire: the check fits as for OpAllow (not blocked, Used + 1 <=
//     Limit); if it does, it adds the lease with expiry Now + TTL and
//     Allowed is true. Otherwise it counts the denial and sets the penalty as
//     OpAllow does.
//   - OpPeek: as for other checks, with Used the live leases.
//   - OpRelease: removes the lease named Lease, live or expired; Allowed
//     reports whether it was live. Nothing else changes.
//   - OpExtend: if the lease named Lease is live, its expiry becomes Now +
//     TTL and Allowed is true; otherwise nothing is written and Allowed is
//     false.
//
// Neither OpRelease nor OpExtend counts a denial or looks at the penalty.
// A key's leases and its count are kept apart: a Concurrent check neither
// sees nor changes the count or window other kinds keep, and they neither
// see nor change its leases (a rule that changes to or from Concurrent
// starts from nothing in the new kind; leases left behind expire). The penalty and the denial tally
// are shared.
//
// The State of a Concurrent check has Begin the earliest expiry of a live
// lease and End the latest (both zero when none is live), after the request.
type Store interface {
	Do(ctx context.Context, r *Request) error
}

// Op is what a Request does.
type Op uint8

// The operations a Store carries out.
const (
	OpAllow Op = iota + 1
	OpPeek
	OpRefund
	OpReset
	OpAcquire
	OpRelease
	OpExtend
)

// String returns the operation's name: "allow", "peek", "refund", "reset",
// "acquire", "release" or "extend".
func (o Op) String() string {
	switch o {
	case OpAllow:
		return "allow"
	case OpPeek:
		return "peek"
	case OpRefund:
		return "refund"
	case OpReset:
		return "reset"
	case OpAcquire:
		return "acquire"
	case OpRelease:
		return "release"
	case OpExtend:
		return "extend"
	}
	return "op?"
}

// Request is one atomic step for a Store: one id, one or more rules. All
// times are truncated to microseconds.
type Request struct {
	Op  Op
	ID  string
	Now time.Time
	N   int64
	// Lease is the token of the lease an OpAcquire takes or an OpRelease or
	// OpExtend names: 22 characters of the URL-safe base64 alphabet. Empty
	// for every other operation.
	Lease  string
	Checks []Check
}

// OnLeases reports whether r works on the leases of a Concurrent check:
// OpAcquire, OpRelease, OpExtend, or OpPeek of a Concurrent rule (which
// comes alone). Every other request, OpReset included, is about counts.
func (r *Request) OnLeases() bool {
	switch r.Op {
	case OpAcquire, OpRelease, OpExtend:
		return true
	case OpPeek:
		return len(r.Checks) == 1 && r.Checks[0].TTL > 0
	}
	return false
}

// Check is one rule of a Request, in the explicit form a Store needs, and the
// State the Store reports back.
type Check struct {
	// UseType is what is limited: the rule's countlimit.UseType.
	UseType string
	Limit   int64
	// Begin and End bound the window a counted event opens if the stored one
	// is not current. End is zero for a lifetime window.
	Begin, End time.Time
	// Span is the length of a Sliding window; zero for every other kind.
	Span time.Duration
	// Interval and Burst make a Smooth window (GCRA; see Store): Interval
	// is the emission interval, the rule's period over its Limit rounded
	// up to the microsecond (one per period when Limit is 0), and Burst
	// how many fit at once; Burst*Interval is at most 100 years. Both are
	// zero for every other kind, and Begin and End are zero when they are
	// set.
	Interval time.Duration
	Burst    int64
	// TTL is the lease length of a Concurrent window; zero for every other
	// kind. Begin and End are zero when Span or TTL is set.
	TTL time.Duration
	// Block is the penalty a denial sets; zero for none.
	Block time.Duration
	// Kind names the rule's window: "rolling", "fixed", "calendar",
	// "sliding", "lifetime", "concurrent" or "smooth"; empty for CheckLimit's window.
	// It never changes a decision: a store may keep it for people to read
	// (pgstore's count_limit.window_kind) or ignore it.
	Kind string

	State State
}

// State is what a Store reports for one Check after a Request.
type State struct {
	// Allowed is the request's verdict, the same for every Check.
	Allowed bool
	// Used is the count in the current window after the request; for a
	// smooth check, the units not yet drained.
	Used int64
	// Begin and End bound the current window (End zero for lifetime). For
	// sliding checks Begin is the oldest logged event and End the newest plus
	// Span; both are zero when the log is empty. For concurrent checks they
	// are the earliest and the latest expiry of a live lease, zero when none
	// is live. For smooth checks Begin is zero and End is when the key is
	// drained (its TAT), zero when it is.
	Begin, End time.Time
	// BlockedUntil is the penalty's end when it is after Now, else zero.
	BlockedUntil time.Time
	// FreeAt is set for a sliding check that did not fit: the logged event
	// whose expiry makes room for N (the (Used+N-Limit)-th oldest). Zero when
	// no expiry can make room (N > Limit). For a smooth check that did not
	// fit, it is the instant N more fit; zero when none ever will (N >
	// Burst, or Limit 0).
	FreeAt time.Time
}

// Smooth reports whether c is a check of a Smooth window (Interval > 0).
func (c *Check) Smooth() bool { return c.Interval > 0 }

// Smooth reports whether any check of r is of a Smooth window: a store
// that does not support them yet refuses r with an error that wraps
// countlimit.ErrInvalid and says so, and writes nothing.
func (r *Request) Smooth() bool {
	for i := range r.Checks {
		if r.Checks[i].Interval > 0 {
			return true
		}
	}
	return false
}

// StoreClock is implemented by stores that can tell their own time:
// pgstore (the server's clock_timestamp()), redisstore (TIME) and memstore
// (this process's clock). countlimit.WithStoreClock uses it.
type StoreClock interface {
	StoreTime(ctx context.Context) (time.Time, error)
}
