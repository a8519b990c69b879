//go:build !unix || aix

package server

import "net"

// unread reports false: where a socket cannot be peeked at without
// blocking (no MSG_DONTWAIT), a connection counts as waiting on the
// server only while owed.
func unread(net.Conn) bool { return false }
