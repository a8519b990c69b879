package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

// longID returns a 512-byte id, the longest the Limiter takes, unique to i,
// in a string of its own as a server decodes it.
func longID(i int) string {
	var b [expose.MaxIDLen]byte
	tail := strconv.AppendInt(append(b[:0:0], '-'), int64(i), 10)
	n := copy(b[len(b)-len(tail):], tail)
	for j := range len(b) - n {
		b[j] = 'x'
	}
	return string(b[:]) // the one allocation: no garbage shares its spans
}

// fill allows one new id after another, made by id, until the store is
// full, and returns how many it took.
func fill(t *testing.T, s *memstore.Store, id func(int) string) int {
	t.Helper()
	l := countlimit.New(s)
	rule := countlimit.Rule{UseType: "api", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	for i := 0; ; i++ {
		r, err := l.Allow(context.Background(), rule, id(i))
		if isFull(err) {
			return i
		}
		if err != nil || !r.Allowed {
			t.Fatalf("Allow of new id %d = %+v, %v; want allowed until ErrFull", i, r, err)
		}
		if i > 1e6 {
			t.Fatal("a million new ids and the store is not full")
		}
	}
}

// TestMaxBytesCountsIDs: the store is full at its byte bound, whatever the
// number of counters: 512-byte ids fill it with a fraction of the counters
// short ids do, and either leaves less room than one more counter takes.
func TestMaxBytesCountsIDs(t *testing.T) {
	t.Parallel()
	const max = 1 << 20
	counts := map[string]int{}
	for _, tc := range []struct {
		name string
		id   func(int) string
		room int64 // under what one more counter of this id costs
	}{
		{"512-byte ids", longID, 1024},
		{"short ids", func(i int) string { return fmt.Sprint("u", i) }, 256},
	} {
		s := memstore.New(memstore.WithShards(1), memstore.WithMaxBytes(max), memstore.WithJanitorInterval(0))
		n := fill(t, s, tc.id)
		counts[tc.name] = n
		if got := s.Bytes(); got > max || max-got >= tc.room {
			t.Errorf("%s: full with %d of %d bytes accounted, want between %d and %d", tc.name, got, max, max-tc.room+1, max)
		}
		if s.Len() != n {
			t.Errorf("%s: Len = %d, want the %d counters allowed", tc.name, s.Len(), n)
		}
		// The counters held go on counting.
		l := countlimit.New(s)
		rule := countlimit.Rule{UseType: "api", Limit: 5, Window: countlimit.Fixed(time.Hour)}
		if r, err := l.Allow(context.Background(), rule, tc.id(0)); err != nil || r.Used != 2 {
			t.Errorf("%s: Allow of a held id in a full store = %+v, %v; want Used 2", tc.name, r, err)
		}
		s.Close()
	}
	if long, short := counts["512-byte ids"], counts["short ids"]; long == 0 || short < 3*long {
		t.Errorf("%d counters of 512-byte ids and %d of short ids fill %d bytes: want over 3 times as many short ones", long, short, max)
	}
}

func TestMaxBytesPerShard(t *testing.T) {
	t.Parallel()
	tests := []struct {
		opts []memstore.Option
		want int64
	}{
		{nil, memstore.DefaultMaxBytes / 64},
		{[]memstore.Option{memstore.WithMaxBytes(1 << 20)}, 1 << 14},
		{[]memstore.Option{memstore.WithMaxBytes(1000), memstore.WithShards(3)}, 250},
		{[]memstore.Option{memstore.WithMaxBytes(0)}, 0},
		{[]memstore.Option{memstore.WithMaxBytes(-1)}, 0},
	}
	for i, tc := range tests {
		s := memstore.New(append(tc.opts, memstore.WithJanitorInterval(0))...)
		if got := memstore.BytesPerShard(s); got != tc.want {
			t.Errorf("case %d: a shard holds %d bytes, want %d", i, got, tc.want)
		}
		s.Close()
	}
}

// TestFullStoreGrowth: in a full store a counter held may count on as long
// as it needs no more memory; a sliding log or a set of leases that must
// grow is refused with ErrFull, and a denial, which grows nothing, is
// answered.
func TestFullStoreGrowth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memstore.New(memstore.WithShards(1), memstore.WithMaxBytes(64<<10), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s, countlimit.WithClock(storetest.NewClock(t0).Now))
	sliding := countlimit.Rule{UseType: "sms", Limit: 1000, Window: countlimit.Sliding(time.Hour)}
	slots := countlimit.Rule{UseType: "job", Limit: 1000, Window: countlimit.Concurrent(time.Hour)}
	if _, err := l.Allow(ctx, sliding, "phone"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Acquire(ctx, slots, "worker"); err != nil {
		t.Fatal(err)
	}
	fill(t, s, func(i int) string { return fmt.Sprint("u", i) })
	before := s.Bytes()
	// The sliding log holds one event: its array is full at once, or after
	// a few more; every event beyond is refused once it would grow it.
	var counted, refused int
	for range 600 {
		switch r, err := l.Allow(ctx, sliding, "phone"); {
		case isFull(err):
			refused++
		case err == nil && r.Allowed:
			counted++
		default:
			t.Fatalf("Allow(sliding) on a full store = %+v, %v", r, err)
		}
	}
	if refused == 0 || counted > 64 {
		t.Errorf("a sliding log in a full store counted %d events and was refused %d times: want its growth refused", counted, refused)
	}
	held := 1
	for range 600 {
		switch _, r, err := l.Acquire(ctx, slots, "worker"); {
		case isFull(err):
		case err == nil && r.Allowed:
			held++
		default:
			t.Fatalf("Acquire on a full store = %+v, %v", r, err)
		}
	}
	if held > 64 {
		t.Errorf("a Concurrent rule in a full store took %d slots: want its growth refused", held)
	}
	if s.Bytes() > 64<<10 || s.Bytes() < before {
		t.Errorf("%d bytes accounted after growing counters in a full store of %d (%d before)", s.Bytes(), 64<<10, before)
	}
	// A denial grows nothing and is answered.
	tight := countlimit.Rule{UseType: "sms", Limit: 1, Window: countlimit.Sliding(time.Hour)}
	if r, err := l.Allow(ctx, tight, "phone"); err != nil || r.Allowed {
		t.Errorf("a denied sliding Allow on a full store = %+v, %v; want denied", r, err)
	}
}

func memStats() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// TestBytesAreHonest: what the store accounts for its counters is what
// they take on the heap, within a margin, for short and long ids, sliding
// logs and leases: the bound it keeps is a bound on memory. The ids are
// made first, so that no garbage of the test's own shares spans with the
// counters, and each is let go once used, as a server lets go of the
// request it came in: what stays of it is the store's.
func TestBytesAreHonest(t *testing.T) {
	if testing.Short() {
		t.Skip("fills stores with tens of megabytes")
	}
	ctx := context.Background()
	fixed := countlimit.Rule{UseType: "api", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	short := func(i int) string { return fmt.Sprint("user-", i) }
	for _, tc := range []struct {
		name string
		n    int
		id   func(int) string
		do   func(l *countlimit.Limiter, id string) error
	}{
		{"512-byte ids", 20000, longID, func(l *countlimit.Limiter, id string) error {
			_, err := l.Allow(ctx, fixed, id)
			return err
		}},
		{"short ids", 50000, short, func(l *countlimit.Limiter, id string) error {
			_, err := l.Allow(ctx, fixed, id)
			return err
		}},
		{"three rules an id", 20000, short, func(l *countlimit.Limiter, id string) error {
			for _, ut := range []countlimit.UseType{"post.create", "comment.create", "password.change"} {
				if _, err := l.Allow(ctx, countlimit.Rule{UseType: ut, Limit: 5, Window: countlimit.Rolling(time.Hour)}, id); err != nil {
					return err
				}
			}
			return nil
		}},
		{"sliding logs of 40 events", 5000, short, func(l *countlimit.Limiter, id string) error {
			r := countlimit.Rule{UseType: "sms", Limit: 100, Window: countlimit.Sliding(time.Hour)}
			_, err := l.AllowN(ctx, r, id, 40)
			return err
		}},
		{"5 leases an id", 5000, short, func(l *countlimit.Limiter, id string) error {
			r := countlimit.Rule{UseType: "job", Limit: 10, Window: countlimit.Concurrent(time.Hour)}
			for range 5 {
				if _, _, err := l.Acquire(ctx, r, id); err != nil {
					return err
				}
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := memstore.New(memstore.WithMaxBytes(0), memstore.WithJanitorInterval(0))
			defer s.Close()
			l := countlimit.New(s)
			before := memStats()
			ids := make([]string, tc.n)
			for i := range ids {
				ids[i] = tc.id(i)
			}
			for i := range ids {
				if err := tc.do(l, ids[i]); err != nil {
					t.Fatal(err)
				}
				ids[i] = ""
			}
			after := memStats()
			slice := float64(len(ids)) * float64(unsafe.Sizeof(""))
			live := float64(after.HeapAlloc) - float64(before.HeapAlloc) - slice
			inuse := float64(after.HeapInuse) - float64(before.HeapInuse) - slice
			accounted := float64(s.Bytes())
			t.Logf("%d ids: an id took %.0f B of live heap, %.0f of spans in use; %.0f accounted", tc.n, live/float64(tc.n), inuse/float64(tc.n), accounted/float64(tc.n))
			if ratio := live / accounted; ratio > 1.1 || ratio < 0.8 {
				t.Errorf("the live heap grew %.0f bytes for %.0f accounted (%.2f times): the accounting is off", live, accounted, ratio)
			}
			if ratio := inuse / accounted; ratio > 1.5 {
				t.Errorf("the heap's spans in use grew %.0f bytes for %.0f accounted (%.2f times): the accounting is off", inuse, accounted, ratio)
			}
			runtime.KeepAlive(ids)
		})
	}
}
