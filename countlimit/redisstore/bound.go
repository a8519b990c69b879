package redisstore

import (
	"context"
	"sync/atomic"
	"time"
)

// boundFresh is how long one shared bound (see bounds) serves new calls:
// each call it serves ends at most maxCall after it was sent, and at least
// maxCall - boundFresh.
const boundFresh = 100 * time.Millisecond

// bounds hands the calls whose context has neither a deadline nor a cancel
// (context.Background and its values) the deadline maxCall asks for, from a
// context shared by every such call sent within boundFresh: one timer every
// 100 ms at most, where a context.WithDeadline of their own cost each call
// a timer set and stopped, a channel and four allocations (about 0.9 µs,
// a quarter of the client's own work on a one-rule Allow:
// BenchmarkSmoothClientCostVersusRedisRate). A shared context is never
// cancelled early; its timer ends it at its deadline.
type bounds struct{ cur atomic.Pointer[sharedBound] }

type sharedBound struct {
	ctx         context.Context
	cancel      context.CancelFunc // never called (ctx's own timer ends it); kept so vet sees it used
	from, until time.Time          // it serves calls sent in [from, until)
}

// within returns ctx, whose Done is nil, bounded to end at most maxCall
// after now, the call's send, with ctx's values.
func (b *bounds) within(ctx context.Context, now time.Time) context.Context {
	s := b.cur.Load()
	if s == nil || now.Before(s.from) || !now.Before(s.until) {
		d, cancel := context.WithDeadline(context.Background(), now.Add(maxCall))
		s = &sharedBound{ctx: d, cancel: cancel, from: now, until: now.Add(boundFresh)}
		b.cur.Store(s) // two callers may each make one: the last stays, both are right
	}
	if ctx == context.Background() {
		return s.ctx
	}
	return bounded{Context: ctx, bound: s.ctx}
}

// bounded is a context without a deadline or a cancel (Context: its values)
// given the deadline of a shared bound.
type bounded struct {
	context.Context
	bound context.Context
}

func (c bounded) Deadline() (time.Time, bool) { return c.bound.Deadline() }
func (c bounded) Done() <-chan struct{}       { return c.bound.Done() }
func (c bounded) Err() error                  { return c.bound.Err() }

// Value is the caller's value for key, and else the bound's: the context
// package finds the bound's cancelCtx through it, so a context derived
// from c is cancelled with the bound, without a goroutine to watch it.
func (c bounded) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.bound.Value(key)
}
