package ruleops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/rulefile"
	"github.com/countlimit/countlimit/internal/ruleops"
)

func TestCheckCost(t *testing.T) {
	rf := rulefile.Default()
	for _, tc := range []struct {
		op      countlimit.Op
		rule    string
		cost    int64
		costSet bool
		want    string // "" for no error
	}{
		{countlimit.OpAllow, "sms.code", 1, false, ""},
		{countlimit.OpAllow, "sms.code", 3, true, ""},
		{countlimit.OpAllow, "sms.code", 0, true, "cost must be 1 to 2^53, got 0"},
		{countlimit.OpRefund, "sms.code", countlimit.MaxLimit + 1, true, "cost must be 1 to 2^53, got 9007199254740993"},
		{countlimit.OpPeek, "sms.code", 1, false, ""},
		{countlimit.OpPeek, "sms.code", 1, true, "peek takes no cost"},
		{countlimit.OpReset, "sms.code", 2, true, "reset takes no cost"},
		{countlimit.OpAllow, "conversation.create", 1, true, ""},
		{countlimit.OpAllow, "conversation.create", 2, true, "a group counts one event: cost must be 1, got 2"},
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
	if err := ruleops.CheckCost(rf, countlimit.OpPeek, "sms.code", 1, true); !errors.As(err, &ce) || ce.Named("--cost") != "peek takes no --cost" {
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
	group, err := ruleops.Resolve(rf, countlimit.OpAllow, "conversation.create", "")
	if err != nil || len(group) < 2 {
		t.Fatalf("Resolve(conversation.create) = %v, %v; want a group", group, err)
	}
	res, err := ruleops.Do(ctx, l, countlimit.OpAllow, group, "u1", 1)
	if err != nil || len(res) != len(group) || !res[0].Allowed {
		t.Fatalf("Do(allow, group) = %+v, %v", res, err)
	}
	if _, err := ruleops.Do(ctx, l, countlimit.OpAllow, group, "u1", 2); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Do(allow, group, cost 2) = %v, want ErrInvalid", err)
	}
	resp := ruleops.NewResponse(rf.Members("conversation.create"), group, res)
	if !resp.Allowed || resp.RetryAfterSeconds != 0 || resp.Results[0].Used != 1 {
		t.Errorf("NewResponse = %+v", resp)
	}
	resetRules, err := ruleops.Resolve(rf, countlimit.OpReset, "conversation.create", "no-such-tier")
	if err != nil {
		t.Fatalf("Resolve(reset) with any tier = %v, want the group's use types", err)
	}
	if res, err := ruleops.Do(ctx, l, countlimit.OpReset, resetRules, "u1", 1); err != nil || res != nil {
		t.Fatalf("Do(reset) = %v, %v", res, err)
	}
	if res, err := ruleops.Do(ctx, l, countlimit.OpPeek, group, "u1", 1); err != nil || res[0].Used != 0 {
		t.Errorf("after reset, peek = %+v, %v; want nothing counted", res, err)
	}
	if o, ok := ruleops.ParseOp("refund"); !ok || o != countlimit.OpRefund {
		t.Errorf("ParseOp(refund) = %v, %v", o, ok)
	}
	if _, ok := ruleops.ParseOp("delete"); ok {
		t.Error("ParseOp(delete) succeeded")
	}
}
