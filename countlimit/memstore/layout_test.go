package memstore

import (
	"context"
	"fmt"
	"runtime"
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
		h := s.hash(string(rule.UseType), id)
		sh := s.shard(h)
		sh.mu.Lock()
		e := sh.get(h, string(rule.UseType), id)
		sh.mu.Unlock()
		if e == nil {
			t.Fatalf("no counter for %s", id)
		}
		if a := uintptr(unsafe.Pointer(e)); a%128 != 0 {
			t.Errorf("the counter of %s starts at %#x, not on a 128-byte boundary", id, a)
		}
	}
}

// TestShardsKeepToTheirCacheLines: a shard fills whole cache lines, so the
// locks of neighbouring shards never share one.
func TestShardsKeepToTheirCacheLines(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is sized for 64-bit platforms")
	}
	if got := unsafe.Sizeof(shard{}); got%64 != 0 {
		t.Fatalf("shard is %d bytes, want a multiple of 64: resize its padding", got)
	}
}

// TestSizeClasses holds allocSize to the running runtime's size classes,
// which runtime.MemStats.BySize lists (all but the largest few).
func TestSizeClasses(t *testing.T) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	classes := ms.BySize[1:] // [0] is the zero size
	for i, c := range classes {
		size := int(c.Size)
		if size == 0 {
			break
		}
		if got := allocSize(size); got != int64(size) {
			t.Errorf("allocSize(%d) = %d, want %d: a size class", size, got, size)
		}
		if i > 0 && allocSize(int(classes[i-1].Size)+1) != int64(size) {
			t.Errorf("allocSize(%d) = %d, want the next class, %d", classes[i-1].Size+1, allocSize(int(classes[i-1].Size)+1), size)
		}
	}
	for _, tc := range []struct{ n, want int }{{0, 0}, {1, 8}, {32768, 32768}, {32769, 40960}, {81920, 81920}} {
		if got := allocSize(tc.n); got != int64(tc.want) {
			t.Errorf("allocSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
	// What an allocation really takes, for sizes the store makes (below 16
	// bytes, pointer-free objects share 16-byte blocks: allocSize rounds
	// them up, which overstates them a little).
	for _, n := range []int{22, 515, 4000, 40000, 80000} {
		before := heapAllocated()
		sink = make([]byte, n)
		if got := heapAllocated() - before; got != uint64(allocSize(n)) {
			t.Errorf("make([]byte, %d) took %d bytes of heap, allocSize says %d", n, got, allocSize(n))
		}
	}
	sink = nil
}

var sink []byte

func heapAllocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}
