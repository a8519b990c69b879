// Package ruleops carries out an operation on named rules: it resolves a
// rule (or group) name and tier from a rule file, validates the cost, calls
// the Limiter, and shapes the answer the HTTP API and the CLI's --json
// print. The service and the CLI are thin transports over it.
package ruleops

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/service/rulefile"
)

// Ops are the operations, in the order the service's endpoints list them.
var Ops = []driver.Op{
	driver.OpAllow, driver.OpPeek, driver.OpRefund, driver.OpReset,
	driver.OpAcquire, driver.OpRelease, driver.OpExtend,
}

// ParseOp returns the operation named name ("allow", "peek", "refund",
// "reset", "acquire", "release", "extend").
func ParseOp(name string) (driver.Op, bool) {
	for _, o := range Ops {
		if o.String() == name {
			return o, true
		}
	}
	return 0, false
}

// IsLeaseOp reports whether o names a lease (release, extend) instead of a
// rule and an id.
func IsLeaseOp(o driver.Op) bool {
	return o == driver.OpRelease || o == driver.OpExtend
}

// CheckCost reports why cost cannot go with op on rule name of rf, or nil:
// cost is 1 to 2^53; only allow and refund take one (costSet says whether
// the caller gave one: an acquire takes one slot); a group counts one
// event. The error wraps countlimit.ErrInvalid and names the field "cost".
func CheckCost(rf *rulefile.File, op driver.Op, name string, cost int64, costSet bool) error {
	switch {
	case cost < 1 || cost > expose.MaxLimit:
		return invalid("\x00 must be 1 to 2^53, got %d", cost)
	case costSet && op != driver.OpAllow && op != driver.OpRefund:
		return invalid("%s takes no \x00", op)
	case op == driver.OpAllow && len(rf.Members(name)) > 1:
		return groupCost(cost)
	}
	return nil
}

// groupCost reports whether cost can go with an allow on a group: a group
// counts one event.
func groupCost(cost int64) error {
	if cost != 1 {
		return invalid("a group counts one event: \x00 must be 1, got %d", cost)
	}
	return nil
}

// CostError is CheckCost's error: bad input, naming the field "cost".
type CostError struct{ msg string } // msg holds \x00 where the field's name goes

func (e *CostError) Error() string { return e.Named("cost") }
func (e *CostError) Unwrap() error { return countlimit.ErrInvalid }

// Named is the message with the field called name (the CLI says "--cost").
func (e *CostError) Named(name string) string { return strings.ReplaceAll(e.msg, "\x00", name) }

func invalid(format string, args ...any) error {
	return &CostError{msg: fmt.Sprintf(format, args...)}
}

// FieldError is bad input that names its field: a rule that does not fit
// the operation ("rule"), or a lease that is malformed ("lease") or is not
// the rule's or id's the request names ("rule", "id"). It wraps
// countlimit.ErrInvalid.
type FieldError struct {
	Field string
	msg   string
}

func (e *FieldError) Error() string { return e.msg }
func (e *FieldError) Unwrap() error { return countlimit.ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, msg: fmt.Sprintf(format, args...)}
}

// Resolve returns the rules op applies to: name's rules at tier, or for
// reset every UseType of name (forgetting needs no tier). Its errors are
// rulefile's (rulefile.ErrUnknown, rulefile.ErrTier), or a FieldError
// naming "rule" when the rule does not fit op: acquire takes one rule with
// a concurrent window; allow and refund take none, since a concurrent rule
// holds slots instead of counting events. Peek and reset take any.
func Resolve(rf *rulefile.File, op driver.Op, name, tier string) ([]countlimit.Rule, error) {
	var rules []countlimit.Rule
	var err error
	if op == driver.OpReset {
		rules, err = rf.ResolveUseTypes(name)
	} else {
		rules, err = rf.Resolve(name, tier)
	}
	if err != nil {
		return nil, err
	}
	members := rf.Members(name)
	switch op {
	case driver.OpAcquire:
		if _, group := rf.Groups[name]; group {
			return nil, fieldErr("rule", "acquire takes one rule with a concurrent window; %s is a group", name)
		}
		if !expose.WindowOf(rules[0].Window).Concurrent {
			return nil, fieldErr("rule", "acquire takes a rule with a concurrent window; %s has %s (allow counts its events)", name, rf.Rules[name].WindowText)
		}
	case driver.OpAllow, driver.OpRefund:
		for i, r := range rules {
			if !expose.WindowOf(r.Window).Concurrent {
				continue
			}
			if len(rules) > 1 {
				return nil, fieldErr("rule", "group %s holds %s, a rule with a concurrent window: a group counts events all-or-nothing, while a concurrent rule holds slots (acquire takes one, release gives it back)", name, members[i])
			}
			return nil, fieldErr("rule", "%s has a concurrent window: it holds slots, not events; acquire takes one and release gives it back", name)
		}
	}
	return rules, nil
}

// Do carries out op for id on rules (one rule, or a group's) with weight
// cost: allow checks a group all-or-nothing (cost must then be 1); peek,
// refund and reset go rule by rule. Reset returns no results.
func Do(ctx context.Context, l *countlimit.Limiter, op driver.Op, rules []countlimit.Rule, id string, cost int64) ([]countlimit.Result, error) {
	switch {
	case op == driver.OpReset:
		for _, rule := range rules {
			if err := l.Reset(ctx, rule, id); err != nil {
				return nil, err
			}
		}
		return nil, nil
	case op == driver.OpAllow && len(rules) > 1:
		if err := groupCost(cost); err != nil {
			return nil, fmt.Errorf("countlimit: allow: %w", err)
		}
		return l.AllowAll(ctx, id, rules...)
	}
	out := make([]countlimit.Result, 0, len(rules))
	for _, rule := range rules {
		var res countlimit.Result
		var err error
		switch op {
		case driver.OpAllow:
			res, err = l.AllowN(ctx, rule, id, cost)
		case driver.OpPeek:
			res, err = l.Peek(ctx, rule, id)
		case driver.OpRefund:
			res, err = l.Refund(ctx, rule, id, cost)
		default:
			return nil, fmt.Errorf("ruleops: unknown operation %v", op)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

// Acquire takes a slot of the one rule Resolve returned for acquire, for
// id. The Lease is the zero Lease when the acquire was denied.
func Acquire(ctx context.Context, l *countlimit.Limiter, rules []countlimit.Rule, id string) (countlimit.Lease, []countlimit.Result, error) {
	if len(rules) != 1 {
		return countlimit.Lease{}, nil, fieldErr("rule", "acquire takes one rule, got %d", len(rules))
	}
	ls, res, err := l.Acquire(ctx, rules[0], id)
	if err != nil {
		return countlimit.Lease{}, nil, err
	}
	return ls, []countlimit.Result{res}, nil
}

// ParseLease reads the lease a release or extend names, as acquire's
// answer gave it, bound to its rule in rf: the lease lives by that rule's
// ttl (see countlimit.Limiter.ParseLease). rule and id are optional: when
// given, they must be the lease's own (rule's UseType is the lease's),
// else a FieldError names the one that differs. A malformed, edited or
// forged lease string, or one whose rule rf no longer holds or whose ttl
// is not its rule's, is a FieldError naming "lease": its slot frees itself
// when its ttl runs out.
func ParseLease(l *countlimit.Limiter, rf *rulefile.File, s, rule, id string) (countlimit.Lease, error) {
	if s == "" {
		return countlimit.Lease{}, fieldErr("lease", "lease is required: the lease string acquire returned")
	}
	var all []countlimit.Rule // every rule that takes slots
	for _, name := range rf.Names() {
		if r := rf.Rules[name]; r != nil && expose.WindowOf(r.Window).Concurrent {
			all = append(all, countlimit.Rule{UseType: r.UseType, Window: r.Window})
		}
	}
	if rule != "" {
		r, ok := rf.Rules[rule]
		switch {
		case !ok && rf.Groups[rule] == nil:
			return countlimit.Lease{}, fieldErr("rule", "unknown rule %q", rule)
		case !ok:
			return countlimit.Lease{}, fieldErr("rule", "%s is a group; a lease is a slot of one rule", rule)
		case !expose.WindowOf(r.Window).Concurrent:
			return countlimit.Lease{}, fieldErr("rule", "rule %s counts events; a lease is a slot of a rule with a concurrent window", rule)
		}
		ls, err := l.ParseLease(s, countlimit.Rule{UseType: r.UseType, Window: r.Window})
		if err != nil {
			if other, err2 := l.ParseLease(s, all...); err2 == nil {
				return countlimit.Lease{}, fieldErr("rule", "the lease is a slot of %q, not of rule %s", expose.LeaseUseType(other), rule)
			}
			return countlimit.Lease{}, leaseErr(err)
		}
		return checkID(ls, id)
	}
	if len(all) == 0 {
		return countlimit.Lease{}, fieldErr("lease", "no rule of %s takes slots (none has a concurrent window)", rf.Name)
	}
	ls, err := l.ParseLease(s, all...)
	if err != nil {
		return countlimit.Lease{}, leaseErr(err)
	}
	return checkID(ls, id)
}

// leaseErr is the FieldError of a lease string that ParseLease refused:
// its own message, without the library's "countlimit: parse lease" that a
// command's or an endpoint's name replaces.
func leaseErr(err error) error {
	if u := errors.Unwrap(err); u != nil {
		err = u
	}
	return &FieldError{Field: "lease", msg: err.Error()}
}

// checkID returns ls, or a FieldError naming "id" when id is given and is
// not the lease's.
func checkID(ls countlimit.Lease, id string) (countlimit.Lease, error) {
	if id != "" && id != ls.ID() {
		return countlimit.Lease{}, fieldErr("id", "the lease was taken for another id than %q", id)
	}
	return ls, nil
}

// DoLease releases or extends ls. Release is idempotent: a lease already
// released or expired is not an error. Extend of a lease no longer held
// fails with countlimit.ErrLeaseExpired.
func DoLease(ctx context.Context, op driver.Op, ls countlimit.Lease) error {
	switch op {
	case driver.OpRelease:
		return ls.Release(ctx)
	case driver.OpExtend:
		return ls.Extend(ctx)
	}
	return fmt.Errorf("ruleops: %v is not a lease operation", op)
}

// AcquireResponse answers acquire: the Response, and when allowed the
// lease string that release and extend take.
type AcquireResponse struct {
	Response
	Lease string `json:"lease,omitempty"`
}

// NewAcquireResponse builds the answer to acquire.
func NewAcquireResponse(name string, rules []countlimit.Rule, results []countlimit.Result, ls countlimit.Lease) AcquireResponse {
	return AcquireResponse{Response: NewResponse([]string{name}, rules, results), Lease: ls.String()}
}

// LeaseResponse answers release and extend.
type LeaseResponse struct {
	Released bool `json:"released,omitempty"`
	Extended bool `json:"extended,omitempty"`
	// ExpiresInSeconds is, after an extend, how long the lease is held
	// from now unless extended again: its ttl.
	ExpiresInSeconds float64 `json:"expires_in_seconds,omitempty"`
}

// NewLeaseResponse builds the answer to a release or extend of ls that
// succeeded.
func NewLeaseResponse(op driver.Op, ls countlimit.Lease) LeaseResponse {
	if op == driver.OpExtend {
		return LeaseResponse{Extended: true, ExpiresInSeconds: expose.LeaseTTL(ls).Seconds()}
	}
	return LeaseResponse{Released: true}
}

// Response answers allow, peek and refund.
type Response struct {
	// Refunded is how many events a refund gave back; absent otherwise.
	Refunded int64 `json:"refunded,omitempty"`
	// Allowed is allow's verdict; for peek and refund, whether an allow
	// now would pass.
	Allowed bool `json:"allowed"`
	// RetryAfterSeconds is 0 when allowed, -1 when no wait helps, else the
	// wait rounded up to the millisecond.
	RetryAfterSeconds float64      `json:"retry_after_seconds"`
	Results           []RuleResult `json:"results"`
}

// RuleResult is one rule's state after a call.
type RuleResult struct {
	Rule    string `json:"rule"`
	UseType string `json:"use_type"`
	Limit   int64  `json:"limit"`
	// Burst is a smooth rule's burst, absent for every other kind: Used
	// counts what has not drained yet, up to Burst, and Remaining what
	// fits at once.
	Burst        int64      `json:"burst,omitempty"`
	Used         int64      `json:"used"`
	Remaining    int64      `json:"remaining"`
	ResetAt      *time.Time `json:"reset_at"`
	BlockedUntil *time.Time `json:"blocked_until"`
}

// NewResponse builds the answer to allow, peek or refund from the rules'
// names, the rules and their results.
func NewResponse(names []string, rules []countlimit.Rule, results []countlimit.Result) Response {
	resp := Response{Allowed: true, Results: make([]RuleResult, len(results))}
	for i, res := range results {
		resp.Allowed = resp.Allowed && res.Allowed
		if !res.Allowed {
			resp.RetryAfterSeconds = combine(resp.RetryAfterSeconds, res.RetryAfter)
		}
		rr := RuleResult{Rule: names[i], UseType: string(rules[i].UseType), Limit: res.Limit, Burst: expose.WindowOf(rules[i].Window).Burst, Used: res.Used, Remaining: res.Remaining}
		if !res.ResetAt.IsZero() {
			t := res.ResetAt.UTC()
			rr.ResetAt = &t
		}
		if !res.BlockedUntil.IsZero() {
			t := res.BlockedUntil.UTC()
			rr.BlockedUntil = &t
		}
		resp.Results[i] = rr
	}
	return resp
}

// combine keeps the longest wait, -1 (never) winning, in seconds rounded
// up to the millisecond so a client that waits as told is never early.
func combine(acc float64, d time.Duration) float64 {
	if acc < 0 || d < 0 {
		return -1
	}
	return math.Max(acc, math.Ceil(d.Seconds()*1000)/1000)
}
