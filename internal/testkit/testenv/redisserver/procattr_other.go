//go:build unix && !linux

package redisserver

import "syscall"

// ProcAttr is nil where the kernel has no parent-death signal: a server
// outlives a test binary killed by its timeout.
func ProcAttr() *syscall.SysProcAttr { return nil }
