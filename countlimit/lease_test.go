package countlimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// TestConcurrentRulesTakeSlotsOnly: the counting calls refuse a Concurrent
// rule, naming the field, and write nothing; Acquire refuses every other
// window.
func TestConcurrentRulesTakeSlotsOnly(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.WithJanitorInterval(0))
	l := countlimit.New(s)
	slots := countlimit.Rule{UseType: "export.running", Limit: 3, Window: countlimit.Concurrent(10 * time.Minute)}
	fixed := countlimit.Rule{UseType: "export.daily", Limit: 3, Window: countlimit.Fixed(time.Hour)}
	for name, call := range map[string]func() error{
		"Allow":    func() error { _, err := l.Allow(ctx, slots, "u"); return err },
		"AllowN":   func() error { _, err := l.AllowN(ctx, slots, "u", 2); return err },
		"Refund":   func() error { _, err := l.Refund(ctx, slots, "u", 1); return err },
		"AllowAll": func() error { _, err := l.AllowAll(ctx, "u", fixed, slots); return err },
	} {
		err := call()
		if !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "Window") || !strings.Contains(err.Error(), "Acquire") {
			t.Errorf("%s of a Concurrent rule = %v, want ErrInvalid naming the window and Acquire", name, err)
		}
	}
	if _, _, err := l.Acquire(ctx, fixed, "u"); !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "Rule.Window") {
		t.Errorf("Acquire of a Fixed rule = %v, want ErrInvalid naming Rule.Window", err)
	}
	big := slots
	big.Limit = countlimit.MaxConcurrentLimit + 1
	if _, _, err := l.Acquire(ctx, big, "u"); !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "Rule.Limit") {
		t.Errorf("Acquire with Limit %d = %v, want ErrInvalid naming Rule.Limit", big.Limit, err)
	}
	if err := (countlimit.Rule{UseType: "x", Limit: 1, Window: countlimit.Concurrent(0)}).Validate(); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Concurrent(0) validates: %v", err)
	}
	if s.Len() != 0 {
		t.Errorf("refused calls left %d counters", s.Len())
	}
	if r, err := l.Peek(ctx, slots, "u"); err != nil || !r.Allowed || r.Used != 0 {
		t.Errorf("Peek of a Concurrent rule = %+v, %v; want allowed, none held", r, err)
	}
	w := countlimit.Concurrent(10 * time.Minute)
	if w.String() != "concurrent 10m0s" || w.Duration() != 10*time.Minute || !w.IsConcurrent() || countlimit.Sliding(time.Minute).IsConcurrent() {
		t.Errorf("Concurrent(10m): String %q, Duration %v, IsConcurrent %v", w, w.Duration(), w.IsConcurrent())
	}
}

// TestLeasesNeverFallBack: while the store is down, Acquire, Release,
// Extend and Peek of a Concurrent rule fail with ErrUnavailable instead of taking slots in a fallback
// store that the store knows nothing of.
func TestLeasesNeverFallBack(t *testing.T) {
	ctx := context.Background()
	fallback := memstore.New(memstore.WithJanitorInterval(0))
	up := memstore.New(memstore.WithJanitorInterval(0))
	slots := countlimit.Rule{UseType: "export.running", Limit: 3, Window: countlimit.Concurrent(10 * time.Minute)}
	lease, _, err := countlimit.New(up).Acquire(ctx, slots, "u")
	if err != nil {
		t.Fatal(err)
	}
	l := countlimit.New(downStore{}, countlimit.WithFallback(fallback))
	if _, _, err := l.Acquire(ctx, slots, "u"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Errorf("Acquire with the store down = %v, want ErrUnavailable", err)
	}
	if _, err := l.Peek(ctx, slots, "u"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Errorf("Peek of a Concurrent rule with the store down = %v, want ErrUnavailable (the fallback holds no leases)", err)
	}
	moved, err := l.ParseLease(lease.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := moved.Release(ctx); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Errorf("Release with the store down = %v, want ErrUnavailable", err)
	}
	if err := moved.Extend(ctx); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Errorf("Extend with the store down = %v, want ErrUnavailable", err)
	}
	if fallback.Len() != 0 {
		t.Errorf("the fallback holds %d counters, want none", fallback.Len())
	}
}

// downStore is a store that cannot be reached.
type downStore struct{}

func (downStore) Do(context.Context, []*countlimit.Request) error {
	return countlimit.Unavailable(errors.New("down"))
}
