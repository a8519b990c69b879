package memstore_test

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
	"github.com/countlimit/countlimit/countlimit/storetest"
)

func TestConformance(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	storetest.Run(t, func(*testing.T) driver.Store { return s })
}

func TestJanitorDropsExpiredState(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(10 * time.Millisecond))
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	short := countlimit.Rule{UseType: "short", Limit: 1, Window: countlimit.Rolling(50 * time.Millisecond)}
	// Each is dropped memstore.ExpiryGrace after it ends: the window at
	// about 1.05s, the penalty, still on then, at 3s.
	penalty := countlimit.Rule{UseType: "penalty", Limit: 0, Window: countlimit.Rolling(time.Millisecond), Block: 2 * time.Second}
	forever := countlimit.Rule{UseType: "forever", Limit: 1, Window: countlimit.Lifetime()}
	for _, r := range []countlimit.Rule{short, penalty, forever} {
		if _, err := l.Allow(ctx, r, "id"); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Len(); got != 3 {
		t.Fatalf("Len = %d after three checks, want 3", got)
	}
	waitFor(t, func() bool { return s.Len() == 2 }, "the 50ms window to be dropped")
	if r, _ := l.Peek(ctx, penalty, "id"); r.BlockedUntil.IsZero() {
		t.Fatal("penalty dropped before it ended")
	}
	waitFor(t, func() bool { return s.Len() == 1 }, "the penalty to be dropped")
	if r, _ := l.Peek(ctx, forever, "id"); r.Used != 1 {
		t.Fatalf("lifetime counter Used = %d, want 1: the janitor must keep it", r.Used)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestClosedAndCanceled(t *testing.T) {
	s := memstore.New()
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: "x", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r, err := l.Allow(ctx, rule, "id"); !errors.Is(err, countlimit.ErrUnavailable) || !errors.Is(err, context.Canceled) || r.Allowed {
		t.Errorf("Allow with a canceled context = %+v, %v; want ErrUnavailable wrapping context.Canceled", r, err)
	}
	s.Close()
	s.Close()
	if _, err := l.Allow(context.Background(), rule, "id"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Errorf("Allow after Close: err = %v, want ErrUnavailable", err)
	}
	if s.Len() != 0 {
		t.Errorf("failed calls wrote state: Len = %d", s.Len())
	}
}

func BenchmarkAllowExistingKey(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	if _, err := l.Allow(ctx, rule, "user-1"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, rule, "user-1"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllowExistingKeyFreshID is BenchmarkAllowExistingKey with the
// id in a string of its own at each call, as a server decodes it from a
// request: the store compares the id's bytes, not just their address.
func BenchmarkAllowExistingKeyFreshID(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = strings.Clone("user-1")
	}
	if _, err := l.Allow(ctx, rule, ids[0]); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := l.Allow(ctx, rule, ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkAllowParallel(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = "user-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := l.Allow(ctx, rule, ids[i%len(ids)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

func BenchmarkAllowSliding(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "sms", Limit: expose.MaxSlidingLimit, Window: countlimit.Sliding(time.Millisecond)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, rule, "phone"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAllowExistingKeyAllocatesNothing(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(0))
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	if _, err := l.Allow(ctx, rule, "user-1"); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := l.Allow(ctx, rule, "user-1"); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Allow on an existing key: %v allocations, want 0", allocs)
	}
}

// TestJanitorDropsDrainedSmoothState: the janitor drops a smooth key once
// it is drained (and its slack past that is over), and keeps one that is
// not.
func TestJanitorDropsDrainedSmoothState(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(10 * time.Millisecond))
	defer s.Close()
	l := countlimit.New(s)
	ctx := context.Background()
	short := countlimit.Rule{UseType: "short", Limit: 1000, Window: countlimit.Smooth(time.Second, 1)}
	long := countlimit.Rule{UseType: "long", Limit: 1, Window: countlimit.Smooth(time.Hour, 1)}
	for _, r := range []countlimit.Rule{short, long} {
		if _, err := l.Allow(ctx, r, "id"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return s.Len() == 1 }, "the drained smooth key to be dropped")
	if r, _ := l.Peek(ctx, long, "id"); r.Used != 1 {
		t.Fatalf("the smooth key drained in an hour has Used %d, want 1: the janitor must keep it", r.Used)
	}
}

// TestSmoothDeadlineFollowsTheTAT: a smooth key's janitor deadline is
// moved when its TAT passes it, though an allow reads no monotonic clock
// while it does not, so the janitor never drops a key that is not
// drained.
func TestSmoothDeadlineFollowsTheTAT(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(0))
	defer s.Close()
	now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	l := countlimit.New(s, countlimit.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "smooth", Limit: 100, Window: countlimit.Smooth(time.Second, 1000)} // 10ms each
	if r, err := l.AllowN(ctx, rule, "id", 150); err != nil || !r.Allowed {
		t.Fatalf("AllowN(150) = %+v, %v", r, err)
	}
	first := memstore.DeadlineForTest(s, "smooth", "id") // the TAT, 1.5s on, and a second
	if r, err := l.AllowN(ctx, rule, "id", 850); err != nil || !r.Allowed {
		t.Fatalf("AllowN(850) = %+v, %v", r, err)
	}
	// The TAT is now 10s on: the deadline moved by at least 10s+1s-2.5s,
	// however long the calls took.
	if moved := memstore.DeadlineForTest(s, "smooth", "id") - first; moved < 8500*time.Millisecond {
		t.Errorf("the deadline moved by %v after the TAT moved 8.5s past it, want at least 8.5s", moved)
	}
}
