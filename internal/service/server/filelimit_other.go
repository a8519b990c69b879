//go:build !unix

package server

// FileLimit returns 0: the system has no RLIMIT_NOFILE.
func FileLimit() int { return 0 }
