package countlimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// Wait is WaitN(ctx, r, id, 1).
func (l *Limiter) Wait(ctx context.Context, r Rule, id string) (Result, error) {
	return l.WaitN(ctx, r, id, 1)
}

// WaitN is AllowN for code that should slow down rather than fail, as
// x/time/rate's Limiter.WaitN: it returns when the event was allowed (and
// counted), with its Result and a nil error.
//
// The WaitN calls of one Limiter for one rule and id wait in line, in the
// order they came and whatever their n, as x/time/rate's reservations do:
// only the first asks the store. While it is denied it sleeps the
// RetryAfter it was told (never less than a millisecond) and a jitter of
// up to a twentieth of that and at most 5 ms, so that waiters in other
// processes told the same instant do not all ask at once; then it asks
// again. The others wait behind it without asking. When it is allowed, or
// gives up, the next asks at once. Other processes and Allow calls are in
// no line: they may take the room first, and the first waiter then sleeps
// again. The store decides every event, so neither the line nor the jitter
// ever lets more through than the rule; the jitter makes a waiter later
// than its room by at most its bound. One rule is one Rule value: two
// rules of one use type (other limits, windows or penalties) count in one
// state, but their waiters wait in two lines.
//
// A store error ends it at once, with the error AllowN returned, and ends
// the waits in line behind it with the same error: the store failed for
// them too. Its own context's end, while it asks, ends its wait alone.
//
// It returns sooner, counting nothing, when:
//   - the context ends while it waits: ctx.Err();
//   - the context's deadline comes before RetryAfter ends, or before the
//     waiter ahead of it wakes to ask again: an error that wraps
//     context.DeadlineExceeded, at once, without sleeping;
//   - no wait makes room (RetryAfter is RetryNever: n above the rule's Limit, or a
//     full Lifetime window): an error that wraps ErrInvalid.
//
// In each case the Result is the last denial's: its own, or, when it never
// asked, that of the waiter ahead of it (zero if that one was not denied
// yet). An Observer is told one decision per WaitN, however many times it
// asked: allowed, with [Decision].Waited set when it slept or waited in
// line first, or denied when it returned without its event for one of the
// reasons above; a store error decides nothing. A Concurrent window holds
// slots rather than counting events: wait for one with WaitAcquire.
func (l *Limiter) WaitN(ctx context.Context, r Rule, id string, n int64) (Result, error) {
	var res Result
	_, err := l.wait(ctx, &res, driver.OpAllow, r, id, n)
	return res, err
}

// WaitAcquire is Acquire that waits for a slot of a Concurrent window as
// WaitN waits for room, in line with the other WaitAcquire calls for r and
// id: it sleeps the RetryAfter it was told (the earliest lease's expiry; a
// Release frees a slot sooner, and is seen at the next try) and returns
// the Lease once one is taken, or the context's error, or ErrInvalid when
// no slot will ever free (a Limit of 0).
func (l *Limiter) WaitAcquire(ctx context.Context, r Rule, id string) (Lease, Result, error) {
	var res Result
	ls, err := l.wait(ctx, &res, driver.OpAcquire, r, id, 1)
	return ls, res, err
}

// minWait is the shortest sleep between two tries: a RetryAfter of 0 on a
// denial (a clock read between the store's and this one) must not spin.
const minWait = time.Millisecond

// A waiter sleeps past its RetryAfter by a random jitter below a
// jitterShare-th of it, and below maxJitter: waiters of several processes
// told one instant spread over up to 5 ms, more than a store's round trip
// on a local network, and one sleeping 50 ms (a smooth rate of 20 a
// second) loses 1.25 ms on average.
const (
	jitterShare = 20
	maxJitter   = 5 * time.Millisecond
)

// randJitter draws a jitter below most, which is positive.
func randJitter(most time.Duration) time.Duration { return rand.N(most) }

// wait is WaitN (op driver.OpAllow) and WaitAcquire (driver.OpAcquire):
// AllowN or Acquire, telling the observer nothing, in its turn in the line
// for r and id, until res is allowed; and the Lease Acquire took.
func (l *Limiter) wait(ctx context.Context, res *Result, op driver.Op, r Rule, id string, n int64) (ls Lease, err error) {
	v := r // checkOne validates in place; the line's key is the rule as given
	if err := checkOne(op, &v, id, n); err != nil {
		return Lease{}, wrap(op, r.UseType, err)
	}
	method := "WaitN"
	if op == driver.OpAcquire {
		method = "WaitAcquire"
	}
	deadline, _ := ctx.Deadline()
	w, ahead := l.waitQueues().join(waitKey{r, id}, deadline)
	if w == nil {
		*res = ahead.denial
		l.tellWait(r.UseType, false, false)
		return Lease{}, pastDeadline(method, n, r, time.Until(ahead.wake), true)
	}
	waited := w.turn != nil
	if waited && !w.await(ctx, res) {
		switch out := w.out; {
		case out != nil && out.failed != nil:
			return Lease{}, out.failed // decides nothing, as the failed try ahead
		case out != nil:
			err = pastDeadline(method, n, r, time.Until(out.wake), true)
		default:
			err = ctx.Err()
		}
		l.tellWait(r.UseType, false, true)
		return Lease{}, err
	}
	var failed error // the store failed w's try: the waits behind it end too
	defer func() { w.leave(failed) }()
	for {
		if op == driver.OpAcquire {
			ls, err = l.acquire(ctx, res, r, id, false)
		} else {
			err = l.one(ctx, res, op, r, id, n, "", false)
		}
		if err != nil {
			if ctx.Err() == nil {
				failed = err
			}
			return Lease{}, err
		}
		if res.Allowed {
			l.tellWait(r.UseType, true, waited)
			return ls, nil
		}
		d, err := l.retryIn(ctx, *res, method, r, n)
		if err != nil {
			l.tellWait(r.UseType, false, waited)
			return Lease{}, err
		}
		w.sleeping(time.Now().Add(d), *res)
		waited = true
		if err := l.sleep(ctx, d); err != nil {
			l.tellWait(r.UseType, false, true)
			return Lease{}, err
		}
		w.awake()
	}
}

// retryIn returns how long a waiter denied res sleeps before it asks
// again, jitter included, or says why it will not: its deadline comes
// first, or no wait helps. The jitter ends before the deadline.
func (l *Limiter) retryIn(ctx context.Context, res Result, method string, r Rule, n int64) (time.Duration, error) {
	d := res.RetryAfter
	if d < 0 {
		return 0, fmt.Errorf("%w: %s(n=%d) can never fit %s's %s window of limit %d: no wait makes room",
			ErrInvalid, method, n, r.UseType, r.Window, r.Limit)
	}
	d = max(d, minWait)
	most := min(d/jitterShare, maxJitter)
	if deadline, ok := ctx.Deadline(); ok {
		left := time.Until(deadline)
		if left < d {
			return 0, pastDeadline(method, n, r, d, false)
		}
		most = min(most, left-d)
	}
	if most > 0 {
		d += l.jitter(most)
	}
	return d, nil
}

// pastDeadline is the error of a wait of d that the context's deadline
// comes before; behind says the wait is another waiter's, ahead in line.
func pastDeadline(method string, n int64, r Rule, d time.Duration, behind bool) error {
	if behind {
		return fmt.Errorf("countlimit: %s(n=%d) on %s would wait at least %v, behind another wait, past the context's deadline: %w",
			method, n, r.UseType, d.Round(time.Microsecond), context.DeadlineExceeded)
	}
	return fmt.Errorf("countlimit: %s(n=%d) on %s would wait %v, past the context's deadline: %w",
		method, n, r.UseType, d, context.DeadlineExceeded)
}

// tellWait tells the observer, if any, the one decision of a wait.
func (l *Limiter) tellWait(ut UseType, allowed, waited bool) {
	if o := l.obs; o != nil && o.Decided != nil {
		o.Decided(Decision{UseType: ut, Allowed: allowed, Waited: waited})
	}
}

// sleepCtx sleeps d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitKey names a line of waiters: a rule as its caller gave it, and an
// id. A WaitN's n is not part of it: weights differ within one line.
type waitKey struct {
	rule Rule
	id   string
}

// waitQueues are a Limiter's lines of waiters, in shards by id so that
// waits for different ids seldom share a lock.
type waitQueues struct {
	seed   maphash.Seed
	shards [16]waitShard
}

type waitShard struct {
	mu sync.Mutex
	// queues holds a line for each key with a waiter, and no other: a
	// line goes when its last waiter leaves. The map keeps the room of its
	// busiest moment (Go's maps do not shrink): memory follows the most
	// lines at once, never the ids ever waited for.
	queues map[waitKey]*waitQueue
	_      [128 - 16]byte // a shard's lock off its neighbours' cache lines
}

// waitQueue is the line of waiters for one key, under its shard's lock.
type waitQueue struct {
	key   waitKey
	shard *waitShard
	// first is the waiter whose turn it is, last the latest to come; each
	// waiter links to its neighbours.
	first, last *waiter
	// sleep is first's while it sleeps; nil while it asks the store.
	sleep *sleepAhead
	// own is the waiter that made the line, made with it.
	own waiter
}

// queuePool keeps lines that went, for the next: a wait that finds nobody
// in line allocates nothing. A line goes to it when its last waiter
// leaves, and no waiter holds it then (one the line put out holds its
// shard, not its line).
var queuePool = sync.Pool{New: func() any { return new(waitQueue) }}

// sleepAhead is the sleep of the waiter first in line: when it ends, and
// the denial that sent it to sleep. A waiter behind it that gives up
// returns that denial.
type sleepAhead struct {
	wake   time.Time
	denial Result
}

// waiter is one wait in a line.
type waiter struct {
	sh *waitShard
	// q is its line while it is in it (out is nil), under sh's lock.
	q          *waitQueue
	prev, next *waiter
	deadline   time.Time // the context's; zero for none
	// turn, nil for a waiter first on arrival, is closed when its turn
	// comes, or when the line puts it out (out set first).
	turn chan struct{}
	out  *waitOut
}

// waitOut is why the line put a waiter out before its turn: the store
// failed the try ahead (failed), or the sleep ahead passes its deadline.
type waitOut struct {
	failed error
	*sleepAhead
}

func (l *Limiter) waitQueues() *waitQueues {
	if qs := l.waits.Load(); qs != nil {
		return qs
	}
	l.waits.CompareAndSwap(nil, &waitQueues{seed: maphash.MakeSeed()})
	return l.waits.Load()
}

// join puts a new waiter for k at the end of its line and returns it; its
// turn is nil when it is first, already. When the waiter first in line
// sleeps past deadline, it returns no waiter but that sleep: the wait
// gives up at once.
func (qs *waitQueues) join(k waitKey, deadline time.Time) (*waiter, *sleepAhead) {
	sh := &qs.shards[maphash.String(qs.seed, k.id)%uint64(len(qs.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.queues[k]
	if q == nil {
		if sh.queues == nil {
			sh.queues = make(map[waitKey]*waitQueue)
		}
		q = queuePool.Get().(*waitQueue)
		q.key, q.shard = k, sh
		q.own = waiter{sh: sh, q: q, deadline: deadline}
		q.first, q.last = &q.own, &q.own
		sh.queues[k] = q
		return &q.own, nil
	}
	if s := q.sleep; s != nil && !deadline.IsZero() && deadline.Before(s.wake) {
		return nil, s
	}
	w := &waiter{sh: sh, q: q, deadline: deadline, turn: make(chan struct{}), prev: q.last}
	q.last.next, q.last = w, w // a line has a waiter while it is kept
	return w, nil
}

// await waits for w's turn and reports whether it came. When it did not,
// w has left the line, with the last denial ahead of it in res: the line
// put it out (w.out), or ctx ended.
func (w *waiter) await(ctx context.Context, res *Result) bool {
	select {
	case <-w.turn:
	case <-ctx.Done():
	}
	sh := w.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	switch {
	case w.out != nil:
		if w.out.sleepAhead != nil {
			*res = w.out.denial
		}
		return false
	case ctx.Err() != nil:
		if s := w.q.sleep; s != nil {
			*res = s.denial
		}
		w.q.leave(w, nil) // its turn may have come meanwhile: then the next one's comes
		return false
	}
	return true
}

// sleeping records that w, first in line, sleeps until wake after denial,
// and puts out the waiters behind it whose deadlines come before.
func (w *waiter) sleeping(wake time.Time, denial Result) {
	s := &sleepAhead{wake, denial}
	w.sh.mu.Lock()
	defer w.sh.mu.Unlock()
	q := w.q
	q.sleep = s
	var out *waitOut
	for x := w.next; x != nil; {
		next := x.next
		if !x.deadline.IsZero() && x.deadline.Before(wake) {
			if out == nil {
				out = &waitOut{sleepAhead: s}
			}
			q.remove(x)
			x.out = out
			close(x.turn)
		}
		x = next
	}
}

// awake records that w, first in line, asks the store again.
func (w *waiter) awake() {
	w.sh.mu.Lock()
	w.q.sleep = nil
	w.sh.mu.Unlock()
}

// leave takes w, whose turn came, out of its line.
func (w *waiter) leave(failed error) {
	sh := w.sh // w may be its line's own, which goes with the line
	sh.mu.Lock()
	w.q.leave(w, failed)
	sh.mu.Unlock()
}

// leave takes w out of q. When w was first, the next waiter's turn comes;
// or, when failed is not nil (the store failed w's try), every waiter
// behind it leaves with that error. The line goes with its last waiter,
// to queuePool.
func (q *waitQueue) leave(w *waiter, failed error) {
	first := q.first == w
	q.remove(w)
	if first {
		q.sleep = nil
		switch {
		case failed != nil && q.first != nil:
			out := &waitOut{failed: failed}
			for x := q.first; x != nil; x = q.first {
				q.remove(x)
				x.out = out
				close(x.turn)
			}
		case q.first != nil:
			close(q.first.turn)
		}
	}
	if q.first == nil {
		delete(q.shard.queues, q.key)
		*q = waitQueue{}
		queuePool.Put(q)
	}
}

// remove unlinks w from q.
func (q *waitQueue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.first = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.last = w.prev
	}
	w.prev, w.next = nil, nil
}
