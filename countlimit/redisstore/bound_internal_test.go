package redisstore

import (
	"context"
	"runtime"
	"testing"
	"time"
)

type boundKey struct{}

// TestBoundsShareADeadlineWithinMaxCall: a call without a deadline or a
// cancel gets one at most maxCall after its send and at least maxCall -
// boundFresh; calls sent within boundFresh of each other share it, later
// ones and ones whose clock reads earlier do not; a caller's values stay.
func TestBoundsShareADeadlineWithinMaxCall(t *testing.T) {
	var b bounds
	t0 := time.Now()
	first := b.within(context.Background(), t0)
	d, ok := first.Deadline()
	if !ok || !d.Equal(t0.Add(maxCall)) {
		t.Fatalf("deadline %v (%v), want %v", d, ok, t0.Add(maxCall))
	}
	if first.Done() == nil || first.Err() != nil {
		t.Fatalf("Done %v, Err %v: want a channel, and no error yet", first.Done(), first.Err())
	}

	inside := t0.Add(boundFresh - time.Millisecond)
	withValue := context.WithValue(context.Background(), boundKey{}, "mine")
	second := b.within(withValue, inside)
	if second.Done() != first.Done() {
		t.Error("a call sent within boundFresh got a bound of its own, want the shared one")
	}
	if d, _ := second.Deadline(); d.After(inside.Add(maxCall)) || d.Before(inside.Add(maxCall-boundFresh)) {
		t.Errorf("deadline %v after the send, want in [%v, %v]", d.Sub(inside), maxCall-boundFresh, maxCall)
	}
	if v := second.Value(boundKey{}); v != "mine" {
		t.Errorf("the caller's value: %v, want mine", v)
	}

	for name, at := range map[string]time.Time{"boundFresh later": t0.Add(boundFresh), "a clock read earlier": t0.Add(-time.Millisecond)} {
		c := b.within(context.Background(), at)
		if d, _ := c.Deadline(); !d.Equal(at.Add(maxCall)) {
			t.Errorf("%s: deadline %v after the send, want maxCall, %v, of its own", name, d.Sub(at), maxCall)
		}
	}
}

// TestBoundedEndsWhatDerivesFromIt: a context made from a bounded one ends
// when the bound does, with the caller's values, as one made from a
// context.WithDeadline would.
func TestBoundedEndsWhatDerivesFromIt(t *testing.T) {
	bound, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	c := bounded{Context: context.WithValue(context.Background(), boundKey{}, "mine"), bound: bound}
	// Through Value the context package finds the bound's own cancelCtx and
	// registers each child there; without it, each child would get a
	// goroutine that waits for the bound's Done.
	before := runtime.NumGoroutine()
	for range 200 {
		_, stop := context.WithCancel(c)
		defer stop()
	}
	if grew := runtime.NumGoroutine() - before; grew >= 100 {
		t.Errorf("200 contexts derived from a bounded one started %d goroutines, want none", grew)
	}
	child, stop := context.WithCancel(c)
	defer stop()
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a context derived from a bounded one outlived the bound by 10s")
	}
	if c.Err() != context.DeadlineExceeded || child.Err() != context.Canceled && child.Err() != context.DeadlineExceeded {
		t.Errorf("Err: bounded %v, derived %v", c.Err(), child.Err())
	}
	if child.Value(boundKey{}) != "mine" {
		t.Errorf("the derived context lost the caller's value")
	}
}
