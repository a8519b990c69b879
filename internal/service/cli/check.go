package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/service/clikit"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/ruleops"
)

// check runs allow, peek, refund, reset or acquire for one id and reports
// whether the answer was a denial: allow or acquire denied, or peek saying
// the next allow would be. A refund or reset that is done is never one.
func check(ctx context.Context, verb string, args []string, stdout io.Writer) (denied bool, err error) {
	o, _ := ruleops.ParseOp(verb)
	fs := clikit.NewFlagSet(verb)
	storeURL := clikit.StoreFlag(fs, "", "postgres://... or redis://...")
	rulesPath := fs.String("rules", "", "YAML rule `FILE` (default: the built-in example rules)")
	cost := fs.Int64("cost", 1, "allow: the event's weight `N`; refund: how many to give back")
	tier := fs.String("tier", "", "the tier `T` whose limit applies")
	asJSON := fs.Bool("json", false, "print the result as the HTTP API's JSON")
	var leaseKey func() ([]countlimit.Option, error)
	if o == driver.OpAcquire {
		leaseKey = leaseKeyFlag(fs)
	}
	pos, err := parseMixed(fs, args)
	if err != nil {
		return false, err
	}
	if len(pos) != 2 {
		return false, clikit.UsageErrorf("%s: want RULE ID, got %s", verb, clikit.Plural(len(pos), "argument", "arguments"))
	}
	name, id := pos[0], pos[1]
	url, err := storeURL()
	if err != nil {
		return false, err
	}
	if url == "memory" {
		return false, clikit.UsageErrorf("%s: --store memory would forget the count when the command exits, so every run would start from zero; name postgres://... or redis://...", verb)
	}
	rf, err := clikit.LoadRules(*rulesPath)
	if err != nil {
		return false, err
	}
	var opts []countlimit.Option
	if leaseKey != nil {
		if opts, err = leaseKey(); err != nil {
			return false, err
		}
	}
	var ce *ruleops.CostError
	if err := ruleops.CheckCost(rf, o, name, *cost, clikit.IsSet(fs, "cost")); errors.As(err, &ce) {
		return false, clikit.UsageErrorf("%s: %s", verb, ce.Named("--cost"))
	}
	rules, err := ruleops.Resolve(rf, o, name, *tier)
	if err != nil {
		if errors.Is(err, rulefile.ErrUnknown) {
			return false, fmt.Errorf("%s: unknown rule %q; rules: %s", verb, name, strings.Join(rf.Names(), ", "))
		}
		return false, fmt.Errorf("%s: %w", verb, err)
	}
	st, err := openStore(ctx, url, false, nil)
	if err != nil {
		return false, err
	}
	defer st.close()
	var lease countlimit.Lease
	var results []countlimit.Result
	if o == driver.OpAcquire {
		lease, results, err = ruleops.Acquire(ctx, countlimit.New(st.store, opts...), rules, id)
	} else {
		results, err = ruleops.Do(ctx, countlimit.New(st.store), o, rules, id, *cost)
	}
	if err != nil {
		return false, err
	}
	if o == driver.OpReset {
		if *asJSON {
			fmt.Fprintln(stdout, `{"reset": true}`)
		} else {
			fmt.Fprintf(stdout, "reset %s for %s\n", name, id)
		}
		return false, nil
	}
	resp := ruleops.NewResponse(rf.Members(name), rules, results)
	if o == driver.OpRefund {
		resp.Refunded = *cost
	}
	if o == driver.OpAcquire && *asJSON {
		b, _ := json.MarshalIndent(ruleops.AcquireResponse{Response: resp, Lease: lease.String()}, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return !resp.Allowed, nil
	}
	if o == driver.OpAcquire && resp.Allowed {
		// The lease alone, for LEASE=$(countlimit acquire ...).
		fmt.Fprintln(stdout, lease)
		return false, nil
	}
	if *asJSON {
		b, _ := json.MarshalIndent(resp, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return o != driver.OpRefund && !resp.Allowed, nil
	}
	switch {
	case o == driver.OpRefund:
		fmt.Fprintf(stdout, "refunded %d: %s for %s", *cost, name, id)
		if !resp.Allowed {
			fmt.Fprint(stdout, "; the next allow would still be denied")
		}
	case o == driver.OpPeek && resp.Allowed:
		fmt.Fprintf(stdout, "would be allowed: %s for %s", name, id)
	case o == driver.OpPeek:
		fmt.Fprintf(stdout, "would be denied: %s for %s", name, id)
	case resp.Allowed:
		fmt.Fprintf(stdout, "allowed: %s for %s", name, id)
	default:
		fmt.Fprintf(stdout, "denied: %s for %s", name, id)
	}
	switch {
	case resp.Allowed:
	case resp.RetryAfterSeconds < 0:
		fmt.Fprint(stdout, " (no wait helps)")
	default:
		fmt.Fprintf(stdout, " (retry in %v)", time.Duration(resp.RetryAfterSeconds*float64(time.Second)).Round(time.Millisecond))
	}
	fmt.Fprintln(stdout)
	for _, r := range resp.Results {
		if r.Burst > 0 {
			fmt.Fprintf(stdout, "  %s: %d of a burst of %d not drained yet, %d left", r.Rule, r.Used, r.Burst, r.Remaining)
		} else {
			fmt.Fprintf(stdout, "  %s: %d of %d used, %d left", r.Rule, r.Used, r.Limit, r.Remaining)
		}
		if r.ResetAt != nil {
			fmt.Fprintf(stdout, ", resets %s", r.ResetAt.Format(time.RFC3339))
		}
		if r.BlockedUntil != nil {
			fmt.Fprintf(stdout, ", blocked until %s", r.BlockedUntil.Format(time.RFC3339))
		}
		fmt.Fprintln(stdout)
	}
	return o != driver.OpRefund && !resp.Allowed, nil
}

// leaseCmd runs release or extend of a lease string and reports whether the
// lease was no longer held (extend only: a release of an expired lease is
// done).
func leaseCmd(ctx context.Context, verb string, args []string, stdout io.Writer) (notHeld bool, err error) {
	o, _ := ruleops.ParseOp(verb)
	fs := clikit.NewFlagSet(verb)
	storeURL := clikit.StoreFlag(fs, "", "postgres://... or redis://...")
	rulesPath := fs.String("rules", "", "YAML rule `FILE` that holds the lease's rule, whose ttl the lease lives by (default: the built-in example rules)")
	asJSON := fs.Bool("json", false, "print the result as the HTTP API's JSON")
	leaseKey := leaseKeyFlag(fs)
	pos, err := parseMixed(fs, args)
	if err != nil {
		return false, err
	}
	if len(pos) != 1 {
		return false, clikit.UsageErrorf("%s: want LEASE (the string acquire printed), got %s", verb, clikit.Plural(len(pos), "argument", "arguments"))
	}
	url, err := storeURL()
	if err != nil {
		return false, err
	}
	if url == "memory" {
		return false, clikit.UsageErrorf("%s: --store memory holds no lease taken by another process; name postgres://... or redis://...", verb)
	}
	rf, err := clikit.LoadRules(*rulesPath)
	if err != nil {
		return false, err
	}
	opts, err := leaseKey()
	if err != nil {
		return false, err
	}
	st, err := openStore(ctx, url, false, nil)
	if err != nil {
		return false, err
	}
	defer st.close()
	ls, err := ruleops.ParseLease(countlimit.New(st.store, opts...), rf, pos[0], "", "")
	if err != nil {
		return false, fmt.Errorf("%s: %w", verb, err)
	}
	err = ruleops.DoLease(ctx, o, ls)
	if errors.Is(err, countlimit.ErrLeaseExpired) {
		if *asJSON {
			fmt.Fprintln(stdout, `{"extended": false}`)
		} else {
			fmt.Fprintf(stdout, "not held: the lease of %s for %s expired or was released; its slot may be someone else's now\n", expose.LeaseUseType(ls), ls.ID())
		}
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if *asJSON {
		b, _ := json.MarshalIndent(ruleops.NewLeaseResponse(o, ls), "", "  ")
		fmt.Fprintln(stdout, string(b))
		return false, nil
	}
	if o == driver.OpExtend {
		fmt.Fprintf(stdout, "extended: the lease of %s for %s is held for %v more\n", expose.LeaseUseType(ls), ls.ID(), expose.LeaseTTL(ls))
	} else {
		fmt.Fprintf(stdout, "released: the lease of %s for %s\n", expose.LeaseUseType(ls), ls.ID())
	}
	return false, nil
}
