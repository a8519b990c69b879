package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// TestSweepKeepsLiveLeases: the janitor keeps a key while a lease of it
// lives, even when its count's window (here a microsecond long) is over.
func TestSweepKeepsLiveLeases(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(memstore.WithJanitorInterval(0))
	defer s.Close()
	l := countlimit.New(s)
	slots := countlimit.Rule{UseType: "job", Limit: 2, Window: countlimit.Concurrent(time.Hour)}
	blink := countlimit.Rule{UseType: "job", Limit: 5, Window: countlimit.Rolling(time.Microsecond)}
	_, res, err := l.Acquire(ctx, slots, "u")
	if err != nil || !res.Allowed {
		t.Fatalf("Acquire = %+v, %v", res, err)
	}
	if _, err := l.Allow(ctx, blink, "u"); err != nil { // a count that is over at once
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	memstore.Sweep(s)
	if r, err := l.Peek(ctx, slots, "u"); err != nil || r.Used != 1 {
		t.Fatalf("after a sweep: %d held (%v), want the live lease", r.Used, err)
	}
}
