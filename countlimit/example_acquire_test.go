package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// A user may run at most 2 exports at once. Each export holds a slot while
// it runs and gives it back when done; a worker that crashes mid-export
// frees its slot 10 minutes after it last extended it.
func ExampleLimiter_Acquire() {
	store := memstore.New()
	defer store.Close()
	now, set := clockAt(time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))
	ctx := context.Background()
	exports := countlimit.Rule{UseType: "export.running", Limit: 2, Window: countlimit.Concurrent(10 * time.Minute)}

	first, res, _ := limiter.Acquire(ctx, exports, "user-42")
	fmt.Println("first export:", res.Allowed, "running:", res.Used)
	limiter.Acquire(ctx, exports, "user-42") // the second one crashes and never releases
	_, res, _ = limiter.Acquire(ctx, exports, "user-42")
	fmt.Println("third export:", res.Allowed, "retry in", res.RetryAfter)

	// The first export runs long: it keeps its slot, then finishes.
	set(now().Add(5 * time.Minute))
	fmt.Println("extend:", first.Extend(ctx))
	first.Release(ctx)
	_, res, _ = limiter.Acquire(ctx, exports, "user-42")
	fmt.Println("after release:", res.Allowed, "running:", res.Used)

	// 10 minutes after it was taken, the crashed export's slot is free.
	set(now().Add(5 * time.Minute))
	_, res, _ = limiter.Acquire(ctx, exports, "user-42")
	fmt.Println("after the crashed one expired:", res.Allowed, "running:", res.Used)
	// Output:
	// first export: true running: 1
	// third export: false retry in 10m0s
	// extend: <nil>
	// after release: true running: 2
	// after the crashed one expired: true running: 2
}

// A lease can be handed to another process, e.g. the worker that finishes
// the job, as a string.
func ExampleLimiter_ParseLease() {
	store := memstore.New()
	defer store.Close()
	limiter := countlimit.New(store)
	ctx := context.Background()
	jobs := countlimit.Rule{UseType: "report.running", Limit: 1, Window: countlimit.Concurrent(time.Hour)}

	lease, _, _ := limiter.Acquire(ctx, jobs, "tenant-7")
	queued := lease.String() // e.g. put in the job's message

	// In the worker:
	held, err := limiter.ParseLease(queued, jobs)
	if err != nil {
		fmt.Println(err) // a malformed or edited string: ErrInvalid
		return
	}
	fmt.Println("release:", held.Release(ctx))
	_, err = limiter.ParseLease(queued[:len(queued)-1], jobs)
	fmt.Println("edited:", err)
	// Output:
	// release: <nil>
	// edited: countlimit: parse lease: invalid argument: lease: checksum does not match: the string was edited or names another rule or id than its token was taken for
}
