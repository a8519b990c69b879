package testbackend

import (
	"net"
	"sync"
	"testing"
)

// DeadAddrs returns two loopback addresses where no store answers: silent
// accepts connections and never replies (a hung server: a client waits
// until its context ends), refused refuses them. Both go when t ends.
func DeadAddrs(t testing.TB) (silent, refused string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	r, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused = r.Addr().String()
	r.Close()
	return ln.Addr().String(), refused
}
