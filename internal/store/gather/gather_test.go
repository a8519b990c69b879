package gather_test

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/gather"
)

// fake is a Send that records its batches and, while gate is set, holds
// each batch until the test releases it.
type fake struct {
	mu       sync.Mutex
	batches  [][]string // ids per batch, in the order sent
	gate     chan struct{}
	started  chan int // size of each batch as it starts
	inFlight atomic.Int32
	maxSeen  atomic.Int32
	outcome  func(c *gather.Call) // sets Err or Retry; nil: success
}

func newFake() *fake { return &fake{started: make(chan int, 1000)} }

func (f *fake) send(ctx context.Context, calls []*gather.Call) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxSeen.Load()
		if n <= m || f.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	ids := make([]string, len(calls))
	for i, c := range calls {
		ids[i] = c.Req.ID
	}
	f.mu.Lock()
	f.batches = append(f.batches, ids)
	gate := f.gate
	f.mu.Unlock()
	f.started <- len(calls)
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			for _, c := range calls {
				c.Err = ctx.Err()
			}
			return
		}
	}
	for _, c := range calls {
		c.Req.Checks[0].State.Used = int64(len(c.Req.ID)) // something the caller can check
		c.Req.Checks[0].State.Allowed = true
		if f.outcome != nil {
			f.outcome(c)
		}
	}
}

func req(id string) *driver.Request {
	return &driver.Request{Op: driver.OpAllow, ID: id, N: 1, Checks: []driver.Check{{UseType: "t", Limit: 10}}}
}

// waitQueued waits until b holds n queued calls.
func waitQueued(t *testing.T, b *gather.Batcher, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued: %d, want %d", b.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIdleCallGoesAtOnceAndWaitersLeaveTogether(t *testing.T) {
	f := newFake()
	f.gate = make(chan struct{})
	b := gather.New(f.send, 4, 1)
	ctx := context.Background()

	var wg sync.WaitGroup
	results := make([]*driver.Request, 7)
	do := func(i int) {
		defer wg.Done()
		results[i] = req(fmt.Sprintf("id-%d", i))
		if err := b.Do(ctx, results[i]); err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	wg.Add(1)
	go do(0)
	if n := <-f.started; n != 1 {
		t.Fatalf("first batch has %d calls, want 1: an idle batcher sends at once", n)
	}
	// Six more arrive while it is in flight: they wait, and leave in
	// batches of at most 4 once it is back.
	for i := 1; i < 7; i++ {
		wg.Add(1)
		go do(i)
	}
	waitQueued(t, b, 6)
	close(f.gate)
	wg.Wait()
	if len(f.batches) != 3 || len(f.batches[1]) != 4 || len(f.batches[2]) != 2 {
		t.Errorf("batches %v, want sizes 1, 4, 2", f.batches)
	}
	if m := f.maxSeen.Load(); m != 1 {
		t.Errorf("%d batches were in flight at once, want at most 1", m)
	}
	for i, r := range results {
		if s := r.Checks[0].State; !s.Allowed || s.Used != int64(len(r.ID)) {
			t.Errorf("call %d got state %+v, not its own", i, s)
		}
	}
}

func TestMaxInFlight(t *testing.T) {
	f := newFake()
	f.gate = make(chan struct{})
	b := gather.New(f.send, 100, 2)
	var wg sync.WaitGroup
	call := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Do(context.Background(), req(fmt.Sprint(i))); err != nil {
				t.Error(err)
			}
		}()
	}
	// With a slot free, each call goes at once; then the rest wait.
	call(0)
	<-f.started
	call(1)
	<-f.started
	for i := 2; i < 10; i++ {
		call(i)
	}
	waitQueued(t, b, 8)
	close(f.gate)
	wg.Wait()
	if m := f.maxSeen.Load(); m != 2 {
		t.Errorf("at most %d batches in flight, want 2", m)
	}
}

func TestCallerLeavesTheQueue(t *testing.T) {
	f := newFake()
	f.gate = make(chan struct{})
	b := gather.New(f.send, 10, 1)
	first := make(chan error)
	go func() { first <- b.Do(context.Background(), req("first")) }()
	<-f.started

	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error)
	go func() { left <- b.Do(ctx, req("leaver")) }()
	waitQueued(t, b, 1)
	cancel()
	err := <-left
	if !errors.Is(err, gather.ErrLeft) || !errors.Is(err, context.Canceled) {
		t.Errorf("a caller that left the queue got %v, want ErrLeft and context.Canceled", err)
	}
	if b.Queued() != 0 {
		t.Errorf("%d calls still queued after the only waiter left", b.Queued())
	}
	close(f.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// The one that left was never sent.
	if err := b.Do(context.Background(), req("after")); err != nil {
		t.Fatal(err)
	}
	for _, batch := range f.batches {
		for _, id := range batch {
			if id == "leaver" {
				t.Errorf("batches %v: the caller that left was sent", f.batches)
			}
		}
	}
}

func TestAbandonedBatchIsCancelledOnlyWhenAllStopWaiting(t *testing.T) {
	blockerGate, blockerSent := make(chan struct{}), make(chan struct{})
	batchCtx := make(chan context.Context, 1)
	send := func(ctx context.Context, calls []*gather.Call) {
		if calls[0].Req.ID == "blocker" {
			close(blockerSent)
			<-blockerGate
			return
		}
		batchCtx <- ctx
		<-ctx.Done() // held until cancelled
		for _, c := range calls {
			c.Err = ctx.Err()
		}
	}
	b := gather.New(send, 10, 1)
	blocker := make(chan error)
	go func() { blocker <- b.Do(context.Background(), req("blocker")) }()
	<-blockerSent

	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	errA, errB := make(chan error), make(chan error)
	go func() { errA <- b.Do(ctx1, req("a")) }()
	go func() { errB <- b.Do(ctx2, req("b")) }()
	waitQueued(t, b, 2)
	close(blockerGate)
	if err := <-blocker; err != nil {
		t.Fatal(err)
	}
	ctx := <-batchCtx // a and b are in flight together

	cancel1()
	if err := <-errA; !errors.Is(err, context.Canceled) || errors.Is(err, gather.ErrLeft) {
		t.Errorf("a caller that stopped waiting after its batch was sent got %v, want context.Canceled without ErrLeft", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the batch was cancelled while one of its callers still waited")
	}
	cancel2()
	if err := <-errB; !errors.Is(err, context.Canceled) {
		t.Errorf("second caller got %v, want context.Canceled", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was not cancelled when every caller had stopped waiting")
	}
}

func TestRetry(t *testing.T) {
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("SendAlone=%v", alone), func(t *testing.T) {
			var mu sync.Mutex
			sent := map[string]int{}
			send := func(_ context.Context, calls []*gather.Call) {
				mu.Lock()
				defer mu.Unlock()
				for _, c := range calls {
					sent[c.Req.ID]++
					switch {
					case c.Req.ID == "never":
						c.Retry()
					case c.Req.ID == "twice" && sent["twice"] == 1:
						c.Retry()
					default:
						c.Req.Checks[0].State.Used = int64(sent[c.Req.ID])
					}
				}
			}
			b := gather.New(send, 10, 1)
			if alone {
				b.SendAlone()
			}
			r := req("twice")
			if err := b.Do(context.Background(), r); err != nil || r.Checks[0].State.Used != 2 {
				t.Errorf("a call retried once: %v, state %+v; want success on its second sending", err, r.Checks[0].State)
			}
			if err := b.Do(context.Background(), req("never")); err == nil || !strings.Contains(err.Error(), "attempts") {
				t.Errorf("a call retried every time: %v, want an error after a bounded number of attempts", err)
			}
			if n := sent["never"]; n < 2 || n > 16 {
				t.Errorf("a call that always asks for a retry was sent %d times", n)
			}
		})
	}
}

type ctxKey struct{}

// TestSendAlone: a lone call is sent on its caller's goroutine with its
// caller's context; calls that arrive meanwhile wait and leave together,
// and the slot passes on to them.
func TestSendAlone(t *testing.T) {
	f := newFake()
	f.gate = make(chan struct{})
	var got []context.Context
	var mu sync.Mutex
	send := func(ctx context.Context, calls []*gather.Call) {
		mu.Lock()
		got = append(got, ctx)
		mu.Unlock()
		f.send(ctx, calls)
	}
	b := gather.New(send, 10, 1)
	b.SendAlone()
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "first"))
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- b.Do(ctx, req("first")) }()
	if n := <-f.started; n != 1 {
		t.Fatalf("first batch has %d calls, want 1", n)
	}
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			if err := b.Do(context.Background(), req(fmt.Sprint(i))); err != nil {
				t.Error(err)
			}
		})
	}
	waitQueued(t, b, 5)
	close(f.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(f.batches) != 2 || len(f.batches[1]) != 5 {
		t.Errorf("batches %v, want sizes 1, 5", f.batches)
	}
	if m := f.maxSeen.Load(); m != 1 {
		t.Errorf("%d batches in flight at once, want at most 1", m)
	}
	mu.Lock()
	defer mu.Unlock()
	if got[0] != ctx {
		t.Errorf("the lone call was sent with context %v, want its caller's", got[0])
	}
	if got[1].Value(ctxKey{}) != nil {
		t.Error("the next batch was sent with the first caller's context")
	}

	// A call whose context has ended is not sent.
	cancel()
	if err := b.Do(ctx, req("late")); !errors.Is(err, gather.ErrLeft) {
		t.Errorf("a call with an ended context: %v, want ErrLeft", err)
	}
	if len(f.batches) != 2 {
		t.Errorf("batches %v: a call with an ended context was sent", f.batches)
	}
}

// TestManyCallers runs many goroutines through one Batcher, some of them
// giving up at random, and checks that every call that succeeded was sent
// exactly once and got its own state, and every call that left was never
// sent.
func TestManyCallers(t *testing.T) {
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("SendAlone=%v", alone), func(t *testing.T) { testManyCallers(t, alone) })
	}
}

func testManyCallers(t *testing.T, alone bool) {
	var mu sync.Mutex
	sent := map[string]int{}
	send := func(ctx context.Context, calls []*gather.Call) {
		mu.Lock()
		for _, c := range calls {
			sent[c.Req.ID]++
		}
		mu.Unlock()
		time.Sleep(time.Duration(len(calls)) * 20 * time.Microsecond)
		for _, c := range calls {
			c.Req.Checks[0].State.Used = int64(len(c.Req.ID))
		}
	}
	b := gather.New(send, 16, 2)
	if alone {
		b.SendAlone()
	}
	const workers, each = 64, 100
	var wg sync.WaitGroup
	outcomes := make([][]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[w] = make([]error, each)
			for i := range each {
				ctx, cancel := context.WithCancel(context.Background())
				if (w+i)%7 == 0 {
					cancel() // gives up at once: leaves, or was already sent
				}
				r := req(fmt.Sprintf("w%d-%d", w, i))
				err := b.Do(ctx, r)
				cancel()
				if err == nil && r.Checks[0].State.Used != int64(len(r.ID)) {
					t.Errorf("%s got state %+v, not its own", r.ID, r.Checks[0].State)
				}
				outcomes[w][i] = err
			}
		}()
	}
	wg.Wait()
	var ok, left int
	for w := range workers {
		for i, err := range outcomes[w] {
			n := sent[fmt.Sprintf("w%d-%d", w, i)]
			switch {
			case err == nil:
				ok++
				if n != 1 {
					t.Errorf("w%d-%d succeeded and was sent %d times", w, i, n)
				}
			case errors.Is(err, gather.ErrLeft):
				left++
				if n != 0 {
					t.Errorf("w%d-%d left the queue and was sent %d times", w, i, n)
				}
			case errors.Is(err, context.Canceled):
				if n != 1 {
					t.Errorf("w%d-%d stopped waiting after it was sent, and was sent %d times", w, i, n)
				}
			default:
				t.Errorf("w%d-%d: %v", w, i, err)
			}
		}
	}
	if ok < workers*each/2 {
		t.Errorf("only %d of %d calls succeeded", ok, workers*each)
	}
	t.Logf("%d succeeded, %d left the queue, of %d", ok, left, workers*each)
}

// TestCallerLeavesWhileItsCallIsRetried: a caller whose context ends while
// its batch is out stops waiting at once even when the batch puts its call
// back in the queue, to be sent again (Retry), between the caller's look in
// the queue and its abandoning the call: it takes the call out of the queue
// (its batch left it undone) instead of waiting for its next sending.
func TestCallerLeavesWhileItsCallIsRetried(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	looked := make(chan struct{})   // the caller did not find its call queued
	requeued := make(chan struct{}) // the batch put the call back
	returned := make(chan struct{}) // Do returned
	hooked := make(chan struct{})   // the batch's hook returned
	release := make(chan struct{})  // ends later sendings
	defer close(release)
	// wait waits for ch, or fails the test when the interleaving this test
	// forces did not happen (rather than hanging).
	wait := func(ch <-chan struct{}, what string) {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Errorf("timed out waiting for %s", what)
		}
	}
	var sendings atomic.Int32
	send := func(_ context.Context, calls []*gather.Call) {
		if sendings.Add(1) > 1 {
			<-release
			return
		}
		cancel()
		wait(looked, "the caller to look for its call in the queue")
		calls[0].Retry()
	}
	b := gather.New(send, 10, 1) // not SendAlone: the caller waits apart from its batch
	gather.SetHooks(b,
		func() { close(looked); wait(requeued, "the batch to put the call back") },
		func() {
			defer close(hooked)
			close(requeued)
			// The call waits in the queue until its caller is done
			// (or, were it stuck, for a while).
			select {
			case <-returned:
			case <-time.After(2 * time.Second):
			}
		})
	defer wait(hooked, "the batch to be done with its hook")
	done := make(chan error, 1)
	go func() { done <- b.Do(ctx, req("x")); close(returned) }()
	select {
	case err := <-done:
		if !errors.Is(err, gather.ErrLeft) || !errors.Is(err, context.Canceled) {
			t.Errorf("Do = %v, want ErrLeft with the context's error", err)
		}
	case <-time.After(time.Second):
		t.Fatal("a caller whose context ended waits for its call's next sending")
	}
	if n := sendings.Load(); n != 1 {
		t.Errorf("the call was sent %d times; want once: its caller took it out of the queue", n)
	}
}

// held is a Send that holds each batch until the test releases it: it
// reports each batch's ids on started, and the batch returns when its
// release channel (handed over with the ids) is closed.
type held struct {
	started chan heldBatch
}

type heldBatch struct {
	ids     []string
	release chan struct{}
}

func (h *held) send(_ context.Context, calls []*gather.Call) {
	hb := heldBatch{release: make(chan struct{})}
	for _, c := range calls {
		hb.ids = append(hb.ids, c.Req.ID)
	}
	h.started <- hb
	<-hb.release
	for _, c := range calls {
		c.Req.Checks[0].State.Allowed = true
	}
}

// next waits for the next batch to start.
func (h *held) next(t *testing.T) heldBatch {
	t.Helper()
	select {
	case hb := <-h.started:
		return hb
	case <-time.After(10 * time.Second):
		t.Fatal("no batch started")
		return heldBatch{}
	}
}

// none checks that no batch starts for a while.
func (h *held) none(t *testing.T) {
	t.Helper()
	select {
	case hb := <-h.started:
		t.Fatalf("batch %v started, want none", hb.ids)
	case <-time.After(20 * time.Millisecond):
	}
}

// byID keys a call by its id, as pgstore keys one by its row.
func byID(r *driver.Request) uint64 { return maphash.String(idSeed, r.ID) }

var idSeed = maphash.MakeSeed()

// keyed returns a Keyed Batcher with 2 slots over a held Send, and do,
// which makes a call on a goroutine of its own; wg waits for those.
func keyed(t *testing.T, maxSize int) (h *held, b *gather.Batcher, do func(id string), wg *sync.WaitGroup) {
	h = &held{started: make(chan heldBatch, 10)}
	b = gather.New(h.send, maxSize, 2)
	b.Keyed(byID)
	wg = &sync.WaitGroup{}
	do = func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Do(context.Background(), req(id)); err != nil {
				t.Error(err)
			}
		}()
	}
	return h, b, do, wg
}

// TestKeyedCallWaitsForItsKey: with Keyed, a call whose key is in flight
// waits for that batch, while a call of another key leaves beside it.
func TestKeyedCallWaitsForItsKey(t *testing.T) {
	h, b, do, wg := keyed(t, 10)
	do("x")
	first := h.next(t)
	do("x") // its key is in flight: it waits, though a slot is free
	waitQueued(t, b, 1)
	h.none(t)
	do("y") // another key: it leaves in the free slot
	second := h.next(t)
	if fmt.Sprint(first.ids, second.ids) != "[x] [y]" {
		t.Fatalf("batches %v %v, want [x] [y]", first.ids, second.ids)
	}
	close(second.release)
	h.none(t) // the second x still waits for the first
	close(first.release)
	third := h.next(t)
	if fmt.Sprint(third.ids) != "[x]" {
		t.Errorf("third batch %v, want [x]", third.ids)
	}
	close(third.release)
	wg.Wait()
}

// TestKeyedBatchBesideIsAsBigAsTheOneInFlight: with Keyed, a batch leaves
// beside one in flight only once it would carry as many calls.
func TestKeyedBatchBesideIsAsBigAsTheOneInFlight(t *testing.T) {
	h, b, do, wg := keyed(t, 100)
	// A batch of 8 in flight: z goes alone, k0 beside it (1 as big as 1),
	// then k1..k8 queue and leave in z's slot when it is done.
	do("z")
	z := h.next(t)
	do("k0")
	k0 := h.next(t)
	for i := 1; i <= 8; i++ {
		do(fmt.Sprint("k", i))
	}
	waitQueued(t, b, 8)
	close(z.release)
	eight := h.next(t)
	close(k0.release)
	if len(eight.ids) != 8 {
		t.Fatalf("batch %v, want k1..k8", eight.ids)
	}
	// Seven calls are fewer than the 8 in flight: they wait.
	for i := 1; i <= 7; i++ {
		do(fmt.Sprint("m", i))
	}
	waitQueued(t, b, 7)
	h.none(t)
	do("m8") // eight: as big as the batch in flight, it leaves beside it
	beside := h.next(t)
	if len(beside.ids) != 8 {
		t.Errorf("batch beside %v, want m1..m8", beside.ids)
	}
	close(beside.release)
	close(eight.release)
	wg.Wait()
}

// TestKeyedManyCallers: 64 goroutines over 8 keys, 3 slots: no two batches
// in flight ever share a key, no call is sent before an earlier call of
// its caller, and every call is answered. (Arrival order across callers of
// one key is pinned by TestKeyedCallWaitsForItsKey, and on PostgreSQL by
// TestSecondBatchNeverSharesARow.)
func TestKeyedManyCallers(t *testing.T) {
	var mu sync.Mutex
	busy := map[string]bool{}
	last := map[string]int{} // per caller: the last sequence number sent
	send := func(_ context.Context, calls []*gather.Call) {
		mu.Lock()
		keys := map[string]bool{}
		for _, c := range calls {
			key, _, _ := strings.Cut(c.Req.ID, "/")
			if busy[key] {
				t.Errorf("key %s is in two batches in flight", key)
			}
			keys[key] = true
			caller, seq, _ := strings.Cut(c.Req.ID, "#")
			n := 0
			fmt.Sscan(seq, &n)
			if n <= last[caller] && last[caller] != 0 {
				t.Errorf("%s sent after call %d of its caller", c.Req.ID, last[caller])
			}
			last[caller] = n
		}
		for k := range keys {
			busy[k] = true
		}
		mu.Unlock()
		time.Sleep(time.Duration(len(calls)) * 10 * time.Microsecond)
		mu.Lock()
		for k := range keys {
			busy[k] = false
		}
		mu.Unlock()
		for _, c := range calls {
			c.Req.Checks[0].State.Used = int64(len(c.Req.ID))
		}
	}
	b := gather.New(send, 16, 3)
	b.SendAlone()
	b.Keyed(func(r *driver.Request) uint64 {
		key, _, _ := strings.Cut(r.ID, "/")
		return byID(&driver.Request{ID: key})
	})
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= 100; i++ {
				r := req(fmt.Sprintf("k%d/w%d#%d", w%8, w, i))
				if err := b.Do(context.Background(), r); err != nil || r.Checks[0].State.Used != int64(len(r.ID)) {
					t.Errorf("%s: %v, state %+v", r.ID, err, r.Checks[0].State)
					return
				}
			}
		}()
	}
	wg.Wait()
	if b.Queued() != 0 {
		t.Errorf("%d calls left in the queue", b.Queued())
	}
}

// TestSendAlonePanicFreesItsSlotAndKey: a Send that panics on its caller's
// goroutine (a call sent alone), recovered by the caller, leaves neither
// the flight slot nor the call's key taken.
func TestSendAlonePanicFreesItsSlotAndKey(t *testing.T) {
	var panics atomic.Bool
	panics.Store(true)
	send := func(_ context.Context, calls []*gather.Call) {
		if panics.Load() {
			panic("send failed")
		}
		for _, c := range calls {
			c.Req.Checks[0].State.Allowed = true
		}
	}
	b := gather.New(send, 10, 1)
	b.SendAlone()
	b.Keyed(byID)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the Send's panic did not reach its caller")
			}
		}()
		b.Do(context.Background(), req("k"))
	}()
	panics.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := req("k")
	if err := b.Do(ctx, r); err != nil || !r.Checks[0].State.Allowed {
		t.Errorf("the next call of the key: %v, %+v; want it sent", err, r.Checks[0].State)
	}
}
