package modeltest

import (
	"slices"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// TestArms holds Arms to the decision's arms for keys of every form
// around a penalty's end and a window's end, each check answered as the
// model answers it.
func TestArms(t *testing.T) {
	now := time.UnixMicro(10_000_000)
	at := now.UnixMicro()
	window := func(limit int64, block time.Duration) driver.Check {
		return driver.Check{UseType: "u", Limit: limit, Begin: now, End: now.Add(5 * time.Second), Block: block}
	}
	for _, tc := range []struct {
		name string
		key  model.Key
		n    int64
		c    driver.Check
		want []string
	}{
		{"a new key", model.Key{}, 1, window(2, 0), []string{ArmNew, ArmAllowedNew}},
		{"a new key, n over the limit", model.Key{}, 3, window(2, 0),
			[]string{ArmNew, ArmDeniedNoBlock, ArmDeniedOver, ArmOverLimit}},
		{"the last event of a window", model.Key{Count: 1, Begin: at - 1, End: at + 5}, 1, window(2, time.Second),
			[]string{ArmCurrent, ArmAllowedIn, ArmAllowedFull}},
		{"a window that ends now", model.Key{Count: 2, Begin: at - 5, End: at}, 1, window(2, 0),
			[]string{ArmEndsNow, ArmAllowedNew}},
		{"an empty window a denial left", model.Key{Begin: at - 1, End: at - 1, Denied: 1}, 1, window(2, 0),
			[]string{ArmNoWindow, ArmAllowedNew}},
		{"full: a penalty set", model.Key{Count: 2, Begin: at - 1, End: at + 5}, 1, window(2, time.Second),
			[]string{ArmCurrent, ArmDeniedSet}},
		{"blocked, asked again", model.Key{Count: 2, Begin: at - 1, End: at + 5, Denied: 1, Blocked: at + 1}, 1, window(2, time.Second),
			[]string{ArmCurrent, ArmBlocked, ArmDeniedBlocked}},
		{"blocked, asked again by a rule without a penalty", model.Key{Count: 1, Begin: at - 1, End: at + 5, Denied: 1, Blocked: at + 1}, 1, window(2, 0),
			[]string{ArmCurrent, ArmBlocked, ArmDeniedBlocked0}},
		{"at a penalty's end, room", model.Key{Count: 0, Begin: at - 1, End: at + 5, Denied: 1, Blocked: at}, 1, window(2, time.Second),
			[]string{ArmCurrent, ArmBlockEndsNow, ArmAllowedIn, ArmEndsNowAllowed}},
		{"at a penalty's end, full", model.Key{Count: 2, Begin: at - 1, End: at + 5, Denied: 1, Blocked: at}, 1, window(2, time.Second),
			[]string{ArmCurrent, ArmBlockEndsNow, ArmDeniedSet, ArmEndsNowDenied}},
		{"a penalty over, a window over", model.Key{Count: 2, Begin: at - 9, End: at - 5, Denied: 1, Blocked: at - 2}, 1, window(0, 0),
			[]string{ArmOver, ArmBlockOver, ArmDeniedNoBlock, ArmDeniedOver, ArmOverLimit}},
		{"a sliding log under a window's rule", model.Key{Count: 1, Begin: at - 1, End: at + 3, Log: []int64{at - 1}}, 1, window(2, 0),
			[]string{ArmLog, ArmAllowedIn, ArmAllowedFull}},
		{"a lifetime window", model.Key{Count: 1, Begin: at - 1, End: model.Forever}, 1, driver.Check{UseType: "u", Limit: 5, Begin: now},
			[]string{ArmLifetime, ArmAllowedIn}},
	} {
		r := &driver.Request{Op: driver.OpAllow, ID: "a", Now: now, N: tc.n, Checks: []driver.Check{tc.c}}
		k := tc.key
		model.Apply(r, []*model.Key{&k})
		got := Arms(tc.key, r, &r.Checks[0])
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Arms = %q, want %q", tc.name, got, tc.want)
		}
		for _, a := range got {
			if !slices.Contains(WindowArms, a) {
				t.Errorf("%s: arm %q is not in WindowArms", tc.name, a)
			}
		}
	}
	// Beside another rule's denial, a check that fits is not denied.
	r := &driver.Request{Op: driver.OpAllow, ID: "a", Now: now, N: 1, Checks: []driver.Check{window(2, 0), {UseType: "v", Limit: 0, Begin: now, End: now.Add(time.Second)}}}
	keys := []*model.Key{{}, {}}
	model.Apply(r, keys)
	if got := Arms(model.Key{}, r, &r.Checks[0]); !slices.Equal(got, []string{ArmNew, ArmOtherDenied}) {
		t.Errorf("beside a denial: Arms = %q", got)
	}
}
