package countlimit

import (
	"context"
	"time"
)

// SetSleep replaces how l's Wait methods sleep, for tests that keep time
// with a fake clock.
func SetSleep(l *Limiter, sleep func(context.Context, time.Duration) error) { l.sleep = sleep }

// SetJitter replaces how l's Wait methods draw the time they sleep past a
// RetryAfter (below most): nil sleeps none past it.
func SetJitter(l *Limiter, jitter func(most time.Duration) time.Duration) {
	if jitter == nil {
		jitter = func(time.Duration) time.Duration { return 0 }
	}
	l.jitter = jitter
}

// WaitLines returns how many lines of waiters l holds, and how many
// waiters are in the line for r and id.
func WaitLines(l *Limiter, r Rule, id string) (lines, waiters int) {
	qs := l.waits.Load()
	if qs == nil {
		return 0, 0
	}
	for i := range qs.shards {
		sh := &qs.shards[i]
		sh.mu.Lock()
		lines += len(sh.queues)
		if q := sh.queues[waitKey{r, id}]; q != nil {
			for w := q.first; w != nil; w = w.next {
				waiters++
			}
		}
		sh.mu.Unlock()
	}
	return lines, waiters
}

// RandJitter is how Wait draws a jitter below most.
var RandJitter = randJitter
