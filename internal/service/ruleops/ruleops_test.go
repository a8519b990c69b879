package ruleops_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/ruleops"
)

func TestCheckCost(t *testing.T) {
	rf := rulefile.Default()
	for _, tc := range []struct {
		op      driver.Op
		rule    string
		cost    int64
		costSet bool
		want    string // "" for no error
	}{
		{driver.OpAllow, "sms.code", 1, false, ""},
		{driver.OpAllow, "sms.code", 3, true, ""},
		{driver.OpAllow, "sms.code", 0, true, "cost must be 1 to 2^53, got 0"},
		{driver.OpRefund, "sms.code", expose.MaxLimit + 1, true, "cost must be 1 to 2^53, got 9007199254740993"},
		{driver.OpPeek, "sms.code", 1, false, ""},
		{driver.OpPeek, "sms.code", 1, true, "peek takes no cost"},
		{driver.OpReset, "sms.code", 2, true, "reset takes no cost"},
		{driver.OpAllow, "conversation.create", 1, true, ""},
		{driver.OpAllow, "conversation.create", 2, true, "a group counts one event: cost must be 1, got 2"},
	} {
		err := ruleops.CheckCost(rf, tc.op, tc.rule, tc.cost, tc.costSet)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckCost(%v, %s, %d) = %v, want nil", tc.op, tc.rule, tc.cost, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want || !errors.Is(err, countlimit.ErrInvalid)):
			t.Errorf("CheckCost(%v, %s, %d) = %v, want ErrInvalid %q", tc.op, tc.rule, tc.cost, err, tc.want)
		}
	}
	var ce *ruleops.CostError
	if err := ruleops.CheckCost(rf, driver.OpPeek, "sms.code", 1, true); !errors.As(err, &ce) || ce.Named("--cost") != "peek takes no --cost" {
		t.Errorf("Named(--cost) of %v is wrong", err)
	}
}

func TestDo(t *testing.T) {
	rf := rulefile.Default()
	store := memstore.New(memstore.WithJanitorInterval(0))
	defer store.Close()
	clock := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	l := countlimit.New(store, countlimit.WithClock(func() time.Time { return clock }))
	ctx := context.Background()
	group, err := ruleops.Resolve(rf, driver.OpAllow, "conversation.create", "")
	if err != nil || len(group) < 2 {
		t.Fatalf("Resolve(conversation.create) = %v, %v; want a group", group, err)
	}
	res, err := ruleops.Do(ctx, l, driver.OpAllow, group, "u1", 1)
	if err != nil || len(res) != len(group) || !res[0].Allowed {
		t.Fatalf("Do(allow, group) = %+v, %v", res, err)
	}
	if _, err := ruleops.Do(ctx, l, driver.OpAllow, group, "u1", 2); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Do(allow, group, cost 2) = %v, want ErrInvalid", err)
	}
	resp := ruleops.NewResponse(rf.Members("conversation.create"), group, res)
	if !resp.Allowed || resp.RetryAfterSeconds != 0 || resp.Results[0].Used != 1 {
		t.Errorf("NewResponse = %+v", resp)
	}
	resetRules, err := ruleops.Resolve(rf, driver.OpReset, "conversation.create", "no-such-tier")
	if err != nil {
		t.Fatalf("Resolve(reset) with any tier = %v, want the group's use types", err)
	}
	if res, err := ruleops.Do(ctx, l, driver.OpReset, resetRules, "u1", 1); err != nil || res != nil {
		t.Fatalf("Do(reset) = %v, %v", res, err)
	}
	if res, err := ruleops.Do(ctx, l, driver.OpPeek, group, "u1", 1); err != nil || res[0].Used != 0 {
		t.Errorf("after reset, peek = %+v, %v; want nothing counted", res, err)
	}
	if o, ok := ruleops.ParseOp("refund"); !ok || o != driver.OpRefund {
		t.Errorf("ParseOp(refund) = %v, %v", o, ok)
	}
	if _, ok := ruleops.ParseOp("delete"); ok {
		t.Error("ParseOp(delete) succeeded")
	}
}

func TestLeaseOps(t *testing.T) {
	rf, err := rulefile.Parse("r.yaml", []byte(`
rules:
  export.running: {window: concurrent 10m, limit: 1}
  upload: {window: concurrent 1m, tiers: {free: 1, pro: 2}}
  sms.code: {window: sliding 5m, limit: 2}
  conversation.hour: {window: fixed 1h, limit: 10}
  conversation.day: {window: fixed 24h, limit: 50}
groups:
  conversation.create: {rules: [conversation.hour, conversation.day]}
`))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.WithJanitorInterval(0))
	defer store.Close()
	t0 := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	clock := t0
	l := countlimit.New(store, countlimit.WithClock(func() time.Time { return clock }))
	ctx := context.Background()

	rules, err := ruleops.Resolve(rf, driver.OpAcquire, "export.running", "")
	if err != nil {
		t.Fatal(err)
	}
	ls, res, err := ruleops.Acquire(ctx, l, rules, "u1")
	if err != nil || !res[0].Allowed || ls.String() == "" {
		t.Fatalf("Acquire = %v, %+v, %v", ls, res, err)
	}
	resp := ruleops.NewAcquireResponse("export.running", rules, res, ls)
	if !resp.Allowed || resp.Lease != ls.String() || resp.Results[0].Used != 1 {
		t.Errorf("NewAcquireResponse = %+v", resp)
	}
	denied, res, err := ruleops.Acquire(ctx, l, rules, "u1")
	if err != nil || res[0].Allowed || denied.String() != "" {
		t.Fatalf("second Acquire = %v, %+v, %v; want a denial", denied, res, err)
	}
	if resp := ruleops.NewAcquireResponse("export.running", rules, res, denied); resp.Allowed || resp.Lease != "" || resp.RetryAfterSeconds != 600 {
		t.Errorf("NewAcquireResponse of a denial = %+v", resp)
	}

	// The lease string, read back, with or without its rule and id; and
	// with its last character changed (to another one: a lease ending in
	// "A" made this case pass its own lease once in 64 runs).
	tampered := ls.String()[:len(ls.String())-1] + "A"
	if tampered == ls.String() {
		tampered = tampered[:len(tampered)-1] + "B"
	}
	for _, tc := range []struct {
		lease, rule, id string
		field           string // "" for no error
	}{
		{ls.String(), "", "", ""},
		{ls.String(), "export.running", "u1", ""},
		{"", "", "", "lease"},
		{"cl1.nope", "", "", "lease"},
		{tampered, "", "", "lease"},
		{ls.String(), "upload", "", "rule"},
		{ls.String(), "conversation.create", "", "rule"},
		{ls.String(), "nope", "", "rule"},
		{ls.String(), "", "u2", "id"},
	} {
		got, err := ruleops.ParseLease(l, rf, tc.lease, tc.rule, tc.id)
		var fe *ruleops.FieldError
		switch {
		case tc.field == "" && (err != nil || got.String() != ls.String()):
			t.Errorf("ParseLease(%.20q, %q, %q) = %v, %v; want the lease", tc.lease, tc.rule, tc.id, got, err)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, countlimit.ErrInvalid)):
			t.Errorf("ParseLease(%.20q, %q, %q) = %v; want ErrInvalid naming %q", tc.lease, tc.rule, tc.id, err, tc.field)
		}
	}

	parsed, _ := ruleops.ParseLease(l, rf, ls.String(), "", "")
	clock = t0.Add(5 * time.Minute)
	if err := ruleops.DoLease(ctx, driver.OpExtend, parsed); err != nil {
		t.Errorf("extend: %v", err)
	}
	if r := ruleops.NewLeaseResponse(driver.OpExtend, parsed); !r.Extended || r.ExpiresInSeconds != 600 {
		t.Errorf("NewLeaseResponse(extend) = %+v", r)
	}
	for i := 0; i < 2; i++ {
		if err := ruleops.DoLease(ctx, driver.OpRelease, parsed); err != nil {
			t.Errorf("release %d: %v", i+1, err)
		}
	}
	if r := ruleops.NewLeaseResponse(driver.OpRelease, parsed); !r.Released || r.Extended {
		t.Errorf("NewLeaseResponse(release) = %+v", r)
	}
	if err := ruleops.DoLease(ctx, driver.OpExtend, parsed); !errors.Is(err, countlimit.ErrLeaseExpired) {
		t.Errorf("extend after release = %v, want ErrLeaseExpired", err)
	}
	if err := ruleops.DoLease(ctx, driver.OpAllow, parsed); err == nil {
		t.Error("DoLease(allow) succeeded")
	}

	// A tiered concurrent rule, and the rules each operation refuses.
	if rules, err := ruleops.Resolve(rf, driver.OpAcquire, "upload", "pro"); err != nil || rules[0].Limit != 2 || !expose.WindowOf(rules[0].Window).Concurrent {
		t.Errorf("Resolve(acquire, upload, pro) = %+v, %v", rules, err)
	}
	for _, tc := range []struct {
		op         driver.Op
		name, tier string
		want       string
	}{
		{driver.OpAcquire, "sms.code", "", "acquire takes a rule with a concurrent window; sms.code has sliding 5m (allow counts its events)"},
		{driver.OpAcquire, "conversation.create", "", "acquire takes one rule with a concurrent window; conversation.create is a group"},
		{driver.OpAllow, "export.running", "", "export.running has a concurrent window: it holds slots, not events; acquire takes one and release gives it back"},
		{driver.OpRefund, "upload", "free", "upload has a concurrent window"},
	} {
		_, err := ruleops.Resolve(rf, tc.op, tc.name, tc.tier)
		var fe *ruleops.FieldError
		if !errors.As(err, &fe) || fe.Field != "rule" || !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Resolve(%v, %s) = %v; want ErrInvalid naming rule, saying %q", tc.op, tc.name, err, tc.want)
		}
	}
	for _, op := range []driver.Op{driver.OpPeek, driver.OpReset} {
		if _, err := ruleops.Resolve(rf, op, "export.running", ""); err != nil {
			t.Errorf("Resolve(%v, export.running) = %v", op, err)
		}
	}
	if err := ruleops.CheckCost(rf, driver.OpAcquire, "export.running", 1, true); err == nil || err.Error() != "acquire takes no cost" {
		t.Errorf("CheckCost(acquire, cost set) = %v", err)
	}

	// A group holding a concurrent rule (a rule file refuses one; a File
	// built by hand may hold it) is refused before the Limiter, which
	// would refuse it too.
	rf.Groups["mixed"] = &rulefile.Group{Name: "mixed", Rules: []string{"sms.code", "export.running"}}
	_, err = ruleops.Resolve(rf, driver.OpAllow, "mixed", "")
	if !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "group mixed holds export.running, a rule with a concurrent window") {
		t.Errorf("Resolve(allow, a group with a concurrent rule) = %v", err)
	}
	mixed, _ := ruleops.Resolve(rf, driver.OpPeek, "mixed", "")
	if _, err := ruleops.Do(ctx, l, driver.OpAllow, mixed, "u1", 1); !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "Concurrent window holds slots") {
		t.Errorf("Do(allow, a group with a concurrent rule) = %v", err)
	}
	if res, err := ruleops.Do(ctx, l, driver.OpPeek, mixed, "u1", 1); err != nil || len(res) != 2 {
		t.Errorf("Do(peek, a group with a concurrent rule) = %+v, %v", res, err)
	}
	for _, name := range []string{"acquire", "release", "extend"} {
		if o, ok := ruleops.ParseOp(name); !ok || o.String() != name {
			t.Errorf("ParseOp(%s) = %v, %v", name, o, ok)
		}
	}
}
