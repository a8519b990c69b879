package countlimit

import (
	"context"
	"time"
)

// SetSleep replaces how l's Wait methods sleep, for tests that keep time
// with a fake clock.
func SetSleep(l *Limiter, sleep func(context.Context, time.Duration) error) { l.sleep = sleep }
