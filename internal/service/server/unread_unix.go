//go:build unix && !aix

package server

import (
	"net"
	"syscall"
)

// unread reports whether bytes from nc's peer wait in its socket, read by
// no one yet. It peeks without consuming, so it is safe beside the
// server's own reads; false when nc is no socket or the peek fails.
func unread(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var (
		b    [1]byte
		n    int
		perr error
	)
	if err := rc.Control(func(fd uintptr) {
		n, _, perr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		return false
	}
	return perr == nil && n > 0
}
