package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/countlimit/countlimit/countlimit"
)

// TestCountersNeverShareACacheLine: every counter the store makes starts on
// a 128-byte boundary and fits in 128 bytes, so two counters never share a
// cache line or its prefetched pair (see entry's padding). A field added to
// entry that pushes it past 128 bytes fails here, not in a benchmark.
func TestCountersNeverShareACacheLine(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is sized for 64-bit platforms")
	}
	if got := unsafe.Sizeof(entry{}); got != 128 {
		t.Fatalf("entry is %d bytes, want 128: resize its padding", got)
	}
	s := New()
	defer s.Close()
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: "api", Limit: 10, Window: countlimit.Fixed(time.Hour)}
	for i := range 64 {
		id := fmt.Sprint("user-", i)
		if _, err := l.Allow(context.Background(), rule, id); err != nil {
			t.Fatal(err)
		}
		h := s.hash(id)
		sh := s.shard(h)
		sh.mu.Lock()
		e := sh.get(h, rule.UseType, id)
		sh.mu.Unlock()
		if e == nil {
			t.Fatalf("no counter for %s", id)
		}
		if a := uintptr(unsafe.Pointer(e)); a%128 != 0 {
			t.Errorf("the counter of %s starts at %#x, not on a 128-byte boundary", id, a)
		}
	}
}
