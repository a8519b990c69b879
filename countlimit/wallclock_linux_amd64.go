//go:build linux && amd64

package countlimit

import (
	"syscall"
	"time"
)

// wallClock is the Limiter's default clock: the system's wall clock, the one
// time.Now reads, at the microsecond, the precision the stores keep. On
// linux/amd64 it is one gettimeofday through the vDSO, whose reading needs
// no cutting, where time.Now makes two clock reads (wall and monotonic)
// that micro must then cut down: a cheaper reading (docs/benchmarks.md has
// the figures).
func wallClock() time.Time {
	var tv syscall.Timeval
	if syscall.Gettimeofday(&tv) != nil {
		return micro(time.Now())
	}
	return time.Unix(tv.Sec, tv.Usec*1000)
}
