//go:build unix

package server

import (
	"math"
	"syscall"
)

// FileLimit returns how many files the process may open: RLIMIT_NOFILE's
// soft limit, which the Go runtime raises to the hard limit at start. 0
// means no limit, or that it cannot be read.
func FileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	cur := uint64(rl.Cur) // int64 on some systems, where RLIM_INFINITY is math.MaxInt64
	if cur >= math.MaxInt32 {
		return 0 // RLIM_INFINITY, or as good as none
	}
	return int(cur)
}
