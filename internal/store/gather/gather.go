// Package gather groups concurrent store calls into batches: group commit on
// PostgreSQL, pipelining on Redis. It has no timers: a call that finds fewer
// than the allowed number of batches in flight is sent at once, with whatever
// calls are waiting; calls that arrive while every slot is busy wait and
// leave together in the next batch. So an idle store adds no latency, and a
// busy one sends fewer, bigger batches. A Keyed Batcher (PostgreSQL's) sends
// a batch beside others in flight only when it shares no key with them and
// is as big as they are; with none in flight, a call still goes at once.
//
// A call whose context ends while it waits in the queue leaves it and is
// not sent: never, or not again when a batch left it undone and put it back
// to be sent again (Retry). A call whose context ends after its batch was
// sent stops waiting and gets the context's error; the batch goes on for the
// others, and is cancelled only when every call in it has stopped waiting.
//
// A batch is sent from a goroutine of the Batcher's, so that its callers can
// stop waiting at any time. A Batcher set to SendAlone sends a call that
// finds a free slot and no call waiting on its caller's goroutine instead,
// with its caller's context: calls that come one at a time then cost no
// hand-off between goroutines.
package gather

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// A Call's state. Queued and sent change under Batcher.mu; sent ends with one
// compare-and-swap: to done by the batch, to abandoned by its caller, or
// back to queued (under Batcher.mu) when its batch asks for it to be sent
// again.
const (
	queued uint32 = iota
	sent
	done
	abandoned
)

// MaxAttempts bounds how often a call is sent again after its row or key
// was created concurrently (see Call.Retry). pgstore's lone statement keeps
// to it too, as countlimit_apply and countlimit_acquire do in SQL (their
// loops of 8): a call that meets a concurrent creation that often fails.
const MaxAttempts = 8

// Call is one caller's request inside a Batcher. Send functions read Req and
// report the outcome with Req's check states and Err, or with Retry.
type Call struct {
	// Req is the caller's request, copied: Send may read it and write its
	// checks' State freely, even after the caller has stopped waiting.
	Req driver.Request
	// Err is the call's error; nil means Req's states hold its result.
	Err error

	checks   [1]driver.Check
	self     [1]*Call // the batch of a call sent alone
	ctx      context.Context
	state    atomic.Uint32
	ready    chan struct{}
	batch    *flight
	retry    bool
	attempts int
	key      uint64 // with Keyed: its key's hash
}

// Retry asks for the call to be sent again in a later batch, for a call that
// the batch left undone (a PostgreSQL row created concurrently, say). A call
// is sent a bounded number of times; then it fails.
func (c *Call) Retry() { c.retry = true }

// Retried reports whether Retry was called since the call was last sent.
func (c *Call) Retried() bool { return c.retry }

// Deadline returns the deadline of the caller's context, if it has one: for
// a Send whose driver honours deadlines but not cancellation (go-redis),
// which can then end a batch once its last caller's deadline has passed.
// A Call made outside a Batcher has none.
func (c *Call) Deadline() (time.Time, bool) {
	if c.ctx == nil {
		return time.Time{}, false
	}
	return c.ctx.Deadline()
}

// flight is one batch in flight. Its context is cancelled when every call
// in it has stopped waiting.
type flight struct {
	live   atomic.Int32
	cancel context.CancelFunc
}

// Send carries out a batch of calls: one round trip, and for PostgreSQL one
// transaction. It sets each call's Err (nil on success) or calls Retry. ctx
// is the batch's own context, not any caller's.
type Send func(ctx context.Context, calls []*Call)

// Batcher gathers concurrent calls into batches. It is safe for concurrent
// use. Its zero value is not usable; make one with New.
type Batcher struct {
	send        Send
	maxSize     int
	maxInFlight int

	alone bool // see SendAlone

	// With Keyed: the hash of a call's key, how many calls of each key
	// are in flight, and how many calls in all.
	key          func(*driver.Request) uint64
	inFlightKeys map[uint64]int
	sentCalls    int

	// Hooks for tests (export_test.go), nil otherwise: afterLeave runs in
	// stopWaiting when its call was not in the queue, before it tries to
	// abandon the call; afterRequeue runs in flushOne once at least one
	// call to send again is back in the queue.
	afterLeave, afterRequeue func()

	mu       sync.Mutex
	queue    []*Call
	inFlight int
}

// New returns a Batcher that sends at most maxSize calls per batch and keeps
// at most maxInFlight batches in flight at once. Both are at least 1.
func New(send Send, maxSize, maxInFlight int) *Batcher {
	return &Batcher{send: send, maxSize: max(1, maxSize), maxInFlight: max(1, maxInFlight)}
}

// SendAlone makes a call that finds a free slot and no call waiting run its
// batch of one on its own goroutine, with its own context, instead of
// handing it to a goroutine of the Batcher's: that hand-off is most of the
// Batcher's cost when calls come one at a time. Such a caller stops waiting
// only when Send returns, so use it with a Send that returns promptly once
// its context ends. Calls that arrive meanwhile wait and leave together, as
// ever. Call SendAlone before the first Do.
func (b *Batcher) SendAlone() { b.alone = true }

// Keyed shapes the batches of a Batcher with more than one flight slot
// for a store whose batches lock what they touch (PostgreSQL's rows):
//
//   - Batches in flight at the same time never share a key (key returns a
//     hash of a call's key). A call whose key is in a batch in flight waits
//     for a batch that leaves after that one is done, instead of leaving
//     in a batch that would only wait behind the other's locks. Calls of
//     one key still go in arrival order. A hash collision only makes a
//     call wait.
//   - A batch leaves beside others in flight only when it carries at least
//     as many calls as they do on average; fewer wait, and leave when a
//     slot is done. A second slot then pays its batch's fixed cost only
//     for a batch as big as the one it overlaps, instead of splitting the
//     callers into ever smaller batches.
//
// With nothing in flight a call still leaves at once. Call Keyed before
// the first Do.
func (b *Batcher) Keyed(key func(*driver.Request) uint64) {
	b.key, b.inFlightKeys = key, map[uint64]int{}
}

// keyBusy reports whether a call of c's key is in flight; b.mu is held.
func (b *Batcher) keyBusy(c *Call) bool {
	return b.key != nil && b.inFlightKeys[c.key] > 0
}

// minBeside is the fewest calls a batch may carry beside other batches
// in flight (see Keyed); b.mu is held.
func (b *Batcher) minBeside(others int) int {
	return max(1, b.sentCalls/max(1, others))
}

// take marks calls in flight; b.mu is held.
func (b *Batcher) take(calls []*Call) {
	if b.key == nil {
		return
	}
	for _, c := range calls {
		b.inFlightKeys[c.key]++
	}
	b.sentCalls += len(calls)
}

// landed marks calls no longer in flight; b.mu is held.
func (b *Batcher) landed(calls []*Call) {
	if b.key == nil {
		return
	}
	for _, c := range calls {
		if c == nil {
			continue
		}
		b.sentCalls--
		if n := b.inFlightKeys[c.key]; n > 1 {
			b.inFlightKeys[c.key] = n - 1
		} else {
			delete(b.inFlightKeys, c.key)
		}
	}
}

var callPool = sync.Pool{New: func() any { return &Call{ready: make(chan struct{}, 1)} }}

// ErrLeft is wrapped in the error of a call whose context ended while it
// was in the queue: before its batch was sent, or after a batch left it
// undone and put it back to be sent again (Retry). Either way nothing of it
// happened.
var ErrLeft = errors.New("left before its batch was sent")

// Do sends req in a batch and waits for its outcome. On success, req's
// checks hold their states. The error, if any, is the one Send set, or the
// context's.
func (b *Batcher) Do(ctx context.Context, req *driver.Request) error {
	c := callPool.Get().(*Call)
	c.Req = *req
	c.Req.Checks = append(c.checks[:0], req.Checks...)
	c.Err, c.ctx, c.batch, c.retry, c.attempts = nil, ctx, nil, false, 0
	if b.key != nil {
		c.key = b.key(req)
	}
	c.state.Store(queued)

	b.mu.Lock()
	lead := b.inFlight == 0
	if !lead && b.inFlight < b.maxInFlight {
		// A batch beside those in flight: with Keyed, only for a call of a
		// key not in flight and a queue that would fill it (see Keyed).
		lead = b.key == nil || !b.keyBusy(c) && len(b.queue)+1 >= b.minBeside(b.inFlight)
	}
	if lead {
		b.inFlight++
		if b.alone && len(b.queue) == 0 {
			if err := ctx.Err(); err != nil {
				b.inFlight--
				b.mu.Unlock()
				c.ctx = nil
				callPool.Put(c)
				return fmt.Errorf("%w: %w", ErrLeft, err)
			}
			c.state.Store(sent)
			c.self[0] = c
			b.take(c.self[:])
			b.mu.Unlock()
			return b.sendAlone(ctx, c, req)
		}
	}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	if lead {
		// In a goroutine of its own, so that this caller, like every
		// other, can stop waiting when its context ends.
		go b.flush()
	}

	select {
	case <-c.ready:
	case <-ctx.Done():
		if err := b.stopWaiting(ctx, c); err != nil {
			return err
		}
	}
	return c.finish(req)
}

// finish hands c's outcome to its caller's req and puts c back in the pool.
func (c *Call) finish(req *driver.Request) error {
	for i := range req.Checks {
		req.Checks[i].State = c.Req.Checks[i].State
	}
	err := c.Err
	c.Req, c.ctx, c.batch, c.Err = driver.Request{}, nil, nil, nil
	callPool.Put(c)
	return err
}

// stopWaiting ends the wait of c's caller, whose context has ended: it takes
// c out of the queue, or abandons it to its batch, and returns the error to
// report; or, when the batch has delivered c meanwhile, it returns nil. A
// call sent and then put back in the queue to be sent again (Retry) is taken
// out like one never sent: its batch left it undone.
func (b *Batcher) stopWaiting(ctx context.Context, c *Call) error {
	for {
		if b.leave(c) {
			return fmt.Errorf("%w: %w", ErrLeft, ctx.Err())
		}
		if b.afterLeave != nil {
			b.afterLeave()
		}
		if c.state.CompareAndSwap(sent, abandoned) {
			// The batch may still write into c: it is not reused.
			if c.batch.live.Add(-1) == 0 {
				c.batch.cancel()
			}
			return ctx.Err()
		}
		if c.state.Load() == done {
			<-c.ready // delivered meanwhile
			return nil
		}
		// Put back in the queue between leave and the swap: again.
	}
}

// sendAlone sends c, a batch of one, on its caller's goroutine (see
// SendAlone), then passes its slot on.
func (b *Batcher) sendAlone(ctx context.Context, c *Call, req *driver.Request) error {
	func() {
		// Deferred, so that a Send that panics on this caller's goroutine
		// (which may recover) leaves neither its slot nor its key taken.
		defer b.aloneDone(c)
		for {
			b.send(ctx, c.self[:])
			if !c.retry || c.Err != nil {
				return
			}
			c.retry = false
			c.attempts++
			if c.attempts >= MaxAttempts {
				c.Err = fmt.Errorf("not done after %d attempts", c.attempts)
				return
			}
			if err := ctx.Err(); err != nil {
				c.Err = fmt.Errorf("%w: %w", ErrLeft, err) // undone, as one that left the queue
				return
			}
		}
	}()
	return c.finish(req)
}

// aloneDone ends c's sending alone: it lands c and passes the slot on to
// the calls waiting, or gives it back.
func (b *Batcher) aloneDone(c *Call) {
	b.mu.Lock()
	b.landed(c.self[:])
	next := len(b.queue) > 0
	if !next {
		b.inFlight--
	}
	b.mu.Unlock()
	if next {
		go b.flush()
	}
}

// Queued reports how many calls wait for a batch: for metrics and tests.
func (b *Batcher) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// leave takes c out of the queue if it is still there, reporting whether it
// was. A call that left is free to reuse.
func (b *Batcher) leave(c *Call) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.state.Load() != queued {
		return false
	}
	for i, q := range b.queue {
		if q == c {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			break
		}
	}
	c.state.Store(abandoned)
	c.Req, c.ctx = driver.Request{}, nil
	callPool.Put(c)
	return true
}

// flush sends batches from the queue, one at a time, in the flight slot its
// caller holds, and passes the slot on: to the next batch while calls are
// waiting, else back. The next batch leaves before the callers of the one
// just done are woken (on another goroutine), so waking them does not delay
// it.
func (b *Batcher) flush() {
	for b.flushOne() {
	}
}

// flushOne sends one batch and hands its retries back to the queue. It
// reports whether calls are waiting for the slot it holds, and if not gives
// the slot back.
func (b *Batcher) flushOne() bool {
	b.mu.Lock()
	calls := b.next()
	if len(calls) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return false
	}
	n := len(calls)
	b.take(calls)
	ctx, cancel := context.WithCancel(context.WithoutCancel(calls[0].ctx))
	f := &flight{cancel: cancel}
	f.live.Store(int32(n))
	for _, c := range calls {
		c.batch = f
		c.state.Store(sent)
	}
	b.mu.Unlock()

	b.send(ctx, calls)
	cancel()

	var again []*Call
	for i, c := range calls {
		if c.retry && c.Err == nil {
			c.retry = false
			c.attempts++
			if c.attempts < MaxAttempts {
				again = append(again, c)
				calls[i] = nil
				continue
			}
			c.Err = fmt.Errorf("not done after %d attempts", c.attempts)
		}
	}

	b.mu.Lock()
	b.landed(calls) // the calls sent again are nil here
	b.landed(again)
	requeued := 0
	if len(again) > 0 {
		// First in the queue, ahead of calls that came later. A caller that
		// stopped waiting is not sent again.
		keep := again[:0]
		for _, c := range again {
			if c.state.CompareAndSwap(sent, queued) {
				keep = append(keep, c)
			}
		}
		requeued = len(keep)
		b.queue = append(keep, b.queue...)
	}
	next := len(b.queue) > 0
	if !next {
		b.inFlight--
	}
	b.mu.Unlock()
	if requeued > 0 && b.afterRequeue != nil {
		b.afterRequeue()
	}
	if next {
		go wake(calls)
	} else {
		wake(calls)
	}
	return next
}

// next takes the next batch out of the queue; b.mu is held, and the caller
// holds a flight slot. Without Keyed it is the first maxSize calls. With
// Keyed and other batches in flight, it is the first maxSize calls whose
// keys are not in flight, and none when they are fewer than minBeside:
// they wait for a batch in flight to be done, and its slot sends them.
func (b *Batcher) next() []*Call {
	if b.key == nil || b.inFlight == 1 {
		n := min(len(b.queue), b.maxSize)
		calls := make([]*Call, n)
		copy(calls, b.queue)
		b.queue = append(b.queue[:0], b.queue[n:]...)
		return calls
	}
	free := 0
	for _, c := range b.queue {
		if !b.keyBusy(c) {
			free++
		}
	}
	if free < b.minBeside(b.inFlight-1) {
		return nil
	}
	calls := make([]*Call, 0, min(free, b.maxSize))
	rest := b.queue[:0]
	for _, c := range b.queue {
		if len(calls) < b.maxSize && !b.keyBusy(c) {
			calls = append(calls, c)
		} else {
			rest = append(rest, c)
		}
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	return calls
}

// wake tells the callers of a batch that it is done. Calls sent again are
// nil.
func wake(calls []*Call) {
	for _, c := range calls {
		if c != nil && c.state.CompareAndSwap(sent, done) {
			c.ready <- struct{}{}
		}
	}
}
