package countlimit

import (
	"time"

	"github.com/countlimit/countlimit/internal/expose"
)

// init hands the module's own packages what countlimit does not export
// (see internal/expose).
func init() {
	expose.WindowOf = func(w any) expose.Window {
		win := w.(Window)
		return expose.Window{Duration: win.duration(), Burst: win.burst, Smooth: win.kind == kindSmooth, Concurrent: win.kind == kindConcurrent}
	}
	expose.Interval = func(w any, limit int64) time.Duration { return w.(Window).smoothInterval(limit) }
	expose.Now = func(l any) time.Time { return l.(*Limiter).reading() }
	expose.ValidateID = validateID
	expose.LeaseTTL = func(l any) time.Duration { return l.(Lease).ttl }
	expose.LeaseUseType = func(l any) string { return string(l.(Lease).useType) }
}
