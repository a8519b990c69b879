package countlimit

import (
	"context"
	"fmt"
	"time"
)

// Wait is WaitN(ctx, r, id, 1).
func (l *Limiter) Wait(ctx context.Context, r Rule, id string) (Result, error) {
	return l.WaitN(ctx, r, id, 1)
}

// WaitN is AllowN for code that should slow down rather than fail, as
// x/time/rate's Limiter.WaitN: it returns when the event was allowed (and
// counted), with its Result and a nil error. While it is denied, WaitN
// sleeps the RetryAfter it was told, never less than a millisecond, then
// asks again: another caller may take the room first, and then it sleeps
// again. A store error ends it at once, with the error AllowN returned.
//
// It returns sooner, counting nothing, when:
//   - the context ends while it sleeps: ctx.Err();
//   - the context's deadline comes before RetryAfter ends: an error that
//     wraps context.DeadlineExceeded, at once, without sleeping;
//   - no wait makes room (RetryAfter -1: n above the rule's Limit, or a
//     full Lifetime window): an error that wraps ErrInvalid.
//
// In each case the Result is the last denial's. A Concurrent window holds
// slots rather than counting events: wait for one with WaitAcquire.
func (l *Limiter) WaitN(ctx context.Context, r Rule, id string, n int64) (Result, error) {
	for {
		res, err := l.AllowN(ctx, r, id, n)
		if err != nil || res.Allowed {
			return res, err
		}
		if err := l.sleepRetry(ctx, res, "WaitN", r, n); err != nil {
			return res, err
		}
	}
}

// WaitAcquire is Acquire that waits for a slot of a Concurrent window as
// WaitN waits for room: it sleeps the RetryAfter it was told (the earliest
// lease's expiry; a Release frees a slot sooner, and is seen at the next
// try) and returns the Lease once one is taken, or the context's error, or
// ErrInvalid when no slot will ever free (a Limit of 0).
func (l *Limiter) WaitAcquire(ctx context.Context, r Rule, id string) (Lease, Result, error) {
	for {
		ls, res, err := l.Acquire(ctx, r, id)
		if err != nil || res.Allowed {
			return ls, res, err
		}
		if err := l.sleepRetry(ctx, res, "WaitAcquire", r, 1); err != nil {
			return ls, res, err
		}
	}
}

// minWait is the shortest sleep between two tries: a RetryAfter of 0 on a
// denial (a clock read between the store's and this one) must not spin.
const minWait = time.Millisecond

// sleepRetry sleeps the wait a denial res asked for, or says why it will
// not: ctx ended, its deadline comes first, or no wait helps.
func (l *Limiter) sleepRetry(ctx context.Context, res Result, method string, r Rule, n int64) error {
	d := res.RetryAfter
	if d < 0 {
		return fmt.Errorf("%w: %s(n=%d) can never fit %s's %s window of limit %d: no wait makes room",
			ErrInvalid, method, n, r.UseType, r.Window, r.Limit)
	}
	d = max(d, minWait)
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return fmt.Errorf("countlimit: %s(n=%d) on %s would wait %v, past the context's deadline: %w",
			method, n, r.UseType, d, context.DeadlineExceeded)
	}
	return l.sleep(ctx, d)
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
