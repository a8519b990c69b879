package redisstore

import (
	"regexp"
	"strconv"
	"testing"
)

// TestNoneIsOneValue holds the copies of "no time" together: each script
// runs alone on the server and cannot share a constant, so fast.lua,
// apply.lua and lease.lua each define NONE, and the reply decoder reads it
// as none.
func TestNoneIsOneValue(t *testing.T) {
	t.Parallel()
	def := regexp.MustCompile(`(?m)^local NONE = (-?\d+)`)
	for name, src := range map[string]string{"fast.lua": builtScripts.fast.src, "apply.lua": builtScripts.apply.src, "lease.lua": builtScripts.lease.src} {
		m := def.FindStringSubmatch(src)
		if m == nil {
			t.Errorf("%s defines no NONE", name)
			continue
		}
		if v, err := strconv.ParseInt(m[1], 10, 64); err != nil || v != none {
			t.Errorf("%s: NONE = %s, want %d, the decoder's none", name, m[1], int64(none))
		}
	}
}
