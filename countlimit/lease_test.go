package countlimit_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
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
	big.Limit = expose.MaxConcurrentLimit + 1
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
	if w.String() != "concurrent 10m0s" || expose.WindowOf(w).Duration != 10*time.Minute || !expose.WindowOf(w).Concurrent || expose.WindowOf(countlimit.Sliding(time.Minute)).Concurrent {
		t.Errorf("Concurrent(10m): String %q, Duration %v, IsConcurrent %v", w, expose.WindowOf(w).Duration, expose.WindowOf(w).Concurrent)
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
	moved, err := l.ParseLease(lease.String(), slots)
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

func (downStore) Do(context.Context, *driver.Request) error {
	return driver.Unavailable(errors.New("down"))
}

// TestSignedLeases: with a lease key, lease strings are signed; a string
// not signed with the key (forged, edited, unsigned, or signed with another
// key) is ErrInvalid and frees nothing, while a Limiter with the same key,
// as another process would have, releases the real one.
func TestSignedLeases(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.WithJanitorInterval(0))
	key := []byte("0123456789abcdef-a-test-key")
	l := countlimit.New(s, countlimit.WithLeaseKey(key))
	slots := countlimit.Rule{UseType: "export.running", Limit: 1, Window: countlimit.Concurrent(10 * time.Minute)}
	alice, _, err := l.Acquire(ctx, slots, "alice")
	if err != nil || alice.String() == "" {
		t.Fatalf("Acquire = %v, %v", alice, err)
	}
	bob, _, err := l.Acquire(ctx, slots, "bob")
	if err != nil || bob.String() == "" {
		t.Fatalf("Acquire = %v, %v", bob, err)
	}
	if !strings.HasPrefix(alice.String(), "cl2.") {
		t.Errorf("a signed lease string = %q, want the cl2 form", alice.String())
	}
	unkeyed := countlimit.New(s)
	otherKey := countlimit.New(s, countlimit.WithLeaseKey([]byte("fedcba9876543210-another-key")))
	other := countlimit.Rule{UseType: "export.other", Limit: 2, Window: slots.Window}
	ua, _, err := unkeyed.Acquire(ctx, other, "alice")
	if err != nil {
		t.Fatal(err)
	}
	oa, _, err := otherKey.Acquire(ctx, other, "alice")
	if err != nil {
		t.Fatal(err)
	}
	// bob's real string with alice's id swapped in.
	bp, ap := strings.Split(bob.String(), "."), strings.Split(alice.String(), ".")
	swapped := strings.Join([]string{bp[0], bp[1], ap[2], bp[3], bp[4], bp[5]}, ".")
	for name, c := range map[string]struct {
		l *countlimit.Limiter
		s string
	}{
		"a string signed with another key":               {l, oa.String()},
		"bob's string naming alice":                      {l, swapped},
		"an unsigned string":                             {l, ua.String()},
		"a signed string, to a Limiter with no key":      {unkeyed, alice.String()},
		"a signed string, to a Limiter with another key": {otherKey, alice.String()},
	} {
		ls, err := c.l.ParseLease(c.s, slots, other)
		if !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "lease") {
			t.Errorf("ParseLease of %s = %v, %v; want ErrInvalid naming the lease", name, ls, err)
		}
	}
	for _, id := range []string{"alice", "bob"} {
		if r, err := l.Peek(ctx, slots, id); err != nil || r.Used != 1 {
			t.Errorf("%s holds %d slots (%v) after the forgeries, want 1", id, r.Used, err)
		}
	}
	if r, err := l.Peek(ctx, other, "alice"); err != nil || r.Used != 2 {
		t.Errorf("alice holds %d slots of %s (%v) after the forgeries, want 2", r.Used, other.UseType, err)
	}
	// Another process with the same key.
	same := countlimit.New(s, countlimit.WithLeaseKey(key))
	moved, err := same.ParseLease(alice.String(), slots)
	if err != nil {
		t.Fatalf("ParseLease with the same key = %v", err)
	}
	if err := moved.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Peek(ctx, slots, "alice"); err != nil || r.Used != 0 {
		t.Errorf("alice holds %d slots (%v) after the release, want 0", r.Used, err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("WithLeaseKey of a 15-byte key did not panic")
			}
		}()
		countlimit.WithLeaseKey(make([]byte, expose.MinLeaseKeyLen-1))
	}()
}

// TestParseLeaseRefusesEdits: a lease string that is malformed, edited or
// names another id than its token was taken for is ErrInvalid; and a
// string's ttl must be its rule's.
func TestParseLeaseRefusesEdits(t *testing.T) {
	ctx := context.Background()
	l := countlimit.New(memstore.New(memstore.WithJanitorInterval(0)))
	rule := countlimit.Rule{UseType: "lease.forged", Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	alice, _, err := l.Acquire(ctx, rule, "alice")
	if err != nil {
		t.Fatal(err)
	}
	s := alice.String()
	parts := strings.Split(s, ".")
	if len(parts) != 6 {
		t.Fatalf("lease string %q: want 6 dot-separated parts", s)
	}
	other := func(i int, v string) string {
		p := append([]string(nil), parts...)
		p[i] = v
		return strings.Join(p, ".")
	}
	bobID := base64.RawURLEncoding.EncodeToString([]byte("bob")) // as a lease string spells it
	for name, f := range map[string]string{
		"empty":                "",
		"garbage":              "not a lease",
		"truncated":            s[:len(s)-1],
		"another id":           other(2, bobID),
		"another ttl":          other(3, "1000"),
		"another token":        other(4, strings.Repeat("A", 22)),
		"short token":          other(4, "AAAA"),
		"bad base64":           other(1, "!!"),
		"another version":      other(0, "cl9"),
		"an extra part":        s + ".x",
		"a zero ttl":           other(3, "0"),
		"a leading-zero ttl":   other(3, "0"+parts[3]),
		"a NUL in the id part": other(2, "AA"),
	} {
		if ls, err := l.ParseLease(f, rule); !errors.Is(err, countlimit.ErrInvalid) {
			t.Errorf("ParseLease(%s) = %v, %v; want ErrInvalid", name, ls, err)
		}
	}
	if _, err := l.ParseLease(s); !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "rules") {
		t.Errorf("ParseLease with no rule = %v; want ErrInvalid naming rules", err)
	}
	if ls, err := l.ParseLease(s, rule); err != nil || ls.String() != alice.String() || expose.LeaseTTL(ls) != time.Minute {
		t.Errorf("ParseLease of the lease's own string = %v, %v", ls, err)
	}
}
