package redisserver

import "syscall"

// ProcAttr has the kernel kill the server when the test process dies, so
// that a test binary killed by its timeout leaves no server behind.
func ProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
