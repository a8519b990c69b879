package testenv_test

import (
	"testing"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// TestFreePortIsBelowTheEphemeralRange: FreePort's ports lie where the
// kernel never picks an outgoing connection's local port, clear of the
// pairs a Redis Cluster takes (2 000 to 10 000 under the range), and are
// free to bind.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	low := testenv.EphemeralLow()
	for range 50 {
		p := testenv.FreePort(t)
		if p < low-10000 || p >= low-2000 {
			t.Fatalf("FreePort = %d, want %d to %d (the ephemeral range starts at %d)", p, low-10000, low-2001, low)
		}
		if !testenv.PortFree(p) {
			t.Errorf("FreePort = %d, which cannot be bound", p)
		}
	}
}
