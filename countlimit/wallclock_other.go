//go:build !(linux && amd64)

package countlimit

import "time"

// wallClock is the Limiter's default clock: time.Now at the microsecond,
// without its monotonic reading (see wallclock_linux_amd64.go for the
// platform where a cheaper read of the same clock exists).
func wallClock() time.Time { return micro(time.Now()) }
