// Package ruleops carries out an operation on named rules: it resolves a
// rule (or group) name and tier from a rule file, validates the cost, calls
// the Limiter, and shapes the answer the HTTP API and the CLI's --json
// print. The service and the CLI are thin transports over it.
package ruleops

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/rulefile"
)

// Ops are the operations, in the order the service's endpoints list them.
var Ops = []countlimit.Op{countlimit.OpAllow, countlimit.OpPeek, countlimit.OpRefund, countlimit.OpReset}

// ParseOp returns the operation named name ("allow", "peek", "refund",
// "reset").
func ParseOp(name string) (countlimit.Op, bool) {
	for _, o := range Ops {
		if o.String() == name {
			return o, true
		}
	}
	return 0, false
}

// CheckCost reports why cost cannot go with op on rule name of rf, or nil:
// cost is 1 to 2^53; peek and reset take none (costSet says whether the
// caller gave one); a group counts one event. The error wraps
// countlimit.ErrInvalid and names the field "cost".
func CheckCost(rf *rulefile.File, op countlimit.Op, name string, cost int64, costSet bool) error {
	switch {
	case cost < 1 || cost > countlimit.MaxLimit:
		return invalid("\x00 must be 1 to 2^53, got %d", cost)
	case costSet && (op == countlimit.OpPeek || op == countlimit.OpReset):
		return invalid("%s takes no \x00", op)
	case op == countlimit.OpAllow && cost != 1 && len(rf.Members(name)) > 1:
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

// Resolve returns the rules op applies to: name's rules at tier, or for
// reset every UseType of name (forgetting needs no tier). Its errors are
// rulefile's (rulefile.ErrUnknown, rulefile.ErrTier).
func Resolve(rf *rulefile.File, op countlimit.Op, name, tier string) ([]countlimit.Rule, error) {
	if op == countlimit.OpReset {
		return rf.ResolveUseTypes(name)
	}
	return rf.Resolve(name, tier)
}

// Do carries out op for id on rules (one rule, or a group's) with weight
// cost: allow checks a group all-or-nothing (cost must then be 1); peek,
// refund and reset go rule by rule. Reset returns no results.
func Do(ctx context.Context, l *countlimit.Limiter, op countlimit.Op, rules []countlimit.Rule, id string, cost int64) ([]countlimit.Result, error) {
	switch {
	case op == countlimit.OpReset:
		for _, rule := range rules {
			if err := l.Reset(ctx, rule, id); err != nil {
				return nil, err
			}
		}
		return nil, nil
	case op == countlimit.OpAllow && len(rules) > 1:
		if cost != 1 {
			return nil, fmt.Errorf("countlimit: allow: %w", invalid("a group counts one event: \x00 must be 1, got %d", cost))
		}
		return l.AllowAll(ctx, id, rules...)
	}
	out := make([]countlimit.Result, 0, len(rules))
	for _, rule := range rules {
		var res countlimit.Result
		var err error
		switch op {
		case countlimit.OpAllow:
			res, err = l.AllowN(ctx, rule, id, cost)
		case countlimit.OpPeek:
			res, err = l.Peek(ctx, rule, id)
		case countlimit.OpRefund:
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

// Response answers allow, peek and refund.
type Response struct {
	Allowed bool `json:"allowed"`
	// RetryAfterSeconds is 0 when allowed, -1 when no wait helps, else the
	// wait rounded up to the millisecond.
	RetryAfterSeconds float64      `json:"retry_after_seconds"`
	Results           []RuleResult `json:"results"`
}

// RuleResult is one rule's state after a call.
type RuleResult struct {
	Rule         string     `json:"rule"`
	UseType      string     `json:"use_type"`
	Limit        int64      `json:"limit"`
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
		rr := RuleResult{Rule: names[i], UseType: string(rules[i].UseType), Limit: res.Limit, Used: res.Used, Remaining: res.Remaining}
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
