package memstore

import (
	"sort"
	"strings"
	"unsafe"

	"github.com/countlimit/countlimit/internal/expose"
)

// sizeClasses are the sizes the Go allocator rounds a small allocation up
// to (the runtime's table, internal/runtime/gc/sizeclasses.go);
// TestSizeClasses holds them to the running runtime's. An allocation above
// the largest takes whole 8 KiB pages.
var sizeClasses = [...]int32{
	8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
	288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408,
	1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912,
	8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760,
	24576, 27264, 28672, 32768,
}

const pageSize = 8 << 10

// allocSize is what an allocation of n bytes takes on the heap.
func allocSize(n int) int64 {
	if n <= 0 {
		return 0
	}
	if n > int(sizeClasses[len(sizeClasses)-1]) {
		return int64((n + pageSize - 1) &^ (pageSize - 1))
	}
	return int64(sizeClasses[sort.Search(len(sizeClasses), func(i int) bool { return int(sizeClasses[i]) >= n })])
}

// What the parts of a counter take on the heap.
var (
	entryBytes    = allocSize(int(unsafe.Sizeof(entry{})))
	leaseSetBytes = allocSize(int(unsafe.Sizeof(leaseSet{})))
)

const (
	eventSize = int(unsafe.Sizeof(int64(0)))
	leaseSize = int(unsafe.Sizeof(lease{}))
	// mapSlotBytes is what a shard's map takes per chain (a counter, but
	// for 64-bit collisions) it has held: a Swiss-table slot of key and
	// pointer with its control byte is 17 bytes, at a load between 7/16
	// (just grown) and 7/8 (about to grow), so 19 to 39 bytes a chain, and
	// a map never shrinks (see shard.peak).
	mapSlotBytes = 40
)

// keyBytes is what a counter's use type and id take. The id is a copy of
// its own (see newEntry); the use type is counted as one too, though it is
// mostly the rule's, shared by every counter of the rule: an upper bound.
func keyBytes(ut string, id string) int64 { return allocSize(len(ut)) + allocSize(len(id)) }

// newEntryBytes is what a new counter of (ut, id) takes before it counts.
func newEntryBytes(ut string, id string) int64 {
	return entryBytes + keyBytes(ut, id)
}

// heap is what e takes on the heap: the entry, its key, its sliding log's
// array and its leases with their tokens.
func (e *entry) heap() int64 {
	n := entryBytes + keyBytes(e.useType, e.id) + allocSize(cap(e.events)*eventSize)
	if ls := e.leases; ls != nil {
		n += leaseSetBytes + allocSize(cap(ls.held)*leaseSize)
		for i := range ls.held {
			n += allocSize(len(ls.held[i].token))
		}
	}
	return n
}

// newEntry returns a counter of (ut, id) with an empty window at now. It
// keeps a copy of id: an id the caller cut from a larger string (a request
// body) would keep all of it alive, unaccounted. The use type is the
// rule's: a check compares it with the rule's at the cost of a pointer
// when they share their bytes.
func newEntry(ut string, id string, now int64) *entry {
	return &entry{useType: ut, id: strings.Clone(id), begin: now, end: now}
}

// grownCap is the capacity an array of elem-byte elements, cap old, grows
// to so that it holds want: twice old (up to most, past which a log or a
// set never goes), or want when more, filling the allocation's size class.
// Growing by it, rather than by append, lets a write know beforehand what
// it will add.
func grownCap(old, want, elem, most int) int {
	return int(allocSize(max(want, min(2*old, most))*elem)) / elem
}

func logCap(old, want int) int {
	return grownCap(old, want, eventSize, expose.MaxSlidingLimit)
}

func leaseCap(old, want int) int {
	return grownCap(old, want, leaseSize, expose.MaxConcurrentLimit)
}
