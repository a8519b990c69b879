//go:build unix

package redisstore_test

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the CPU time, user and system, the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSmoothCPUVersusRedisRate is BenchmarkSmoothVersusRedisRate at
// one caller, measured by the client's CPU time as well as the wall's:
// 20 rounds of 2 000 calls a side (b.N rounds in all, -benchtime 1x),
// redis_rate's Allow and countlimit's under the same Smooth rule, their
// order alternating, the process's CPU time (getrusage) read around each.
// It reports each side's CPU and wall microseconds a call and the smooth
// Allow's calls a second over redis_rate's (x-redis_rate). The client's
// CPU a call moves far less from run to run than the round trip's wall
// time, which is where a difference of a few microseconds shows.
func BenchmarkSmoothCPUVersusRedisRate(b *testing.B) {
	_, _, theirs, ours := smoothSides(b, "smoothcpu")
	sides := [2]func(id string) error{theirs, ours}
	const rounds, calls = 20, 2000
	var wall, cpu [2]time.Duration // redis_rate's, countlimit's
	next := 0
	for range b.N {
		for r := range rounds {
			for k := range 2 {
				side := (r + k) % 2
				w, t := time.Now(), processCPU(b)
				for i := range calls {
					if err := sides[side](versusIDs[(next+i)%len(versusIDs)]); err != nil {
						b.Fatal(err)
					}
				}
				wall[side] += time.Since(w)
				cpu[side] += processCPU(b) - t
			}
			next += calls
		}
	}
	n := float64(b.N * rounds * calls)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / n }
	b.ReportMetric(us(cpu[0]), "redis_rate-cpu-µs")
	b.ReportMetric(us(cpu[1]), "smooth-cpu-µs")
	b.ReportMetric(us(wall[0]), "redis_rate-wall-µs")
	b.ReportMetric(us(wall[1]), "smooth-wall-µs")
	b.ReportMetric(float64(wall[0])/float64(wall[1]), "x-redis_rate")
}
