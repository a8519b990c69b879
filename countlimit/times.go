package countlimit

import (
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// The instants a Limiter works with lie from the Unix epoch until
// 2150-01-01 UTC (driver.InRange): clock readings, CheckLimit's beginTime.
// Every instant a store then keeps (a window's end, a penalty's end, a
// lease's expiry: at most 100 years later, and a calendar
// year's end) lies before 2255, within 2^53 microseconds of the epoch, so
// every store keeps it exactly: in int64 microseconds, in PostgreSQL's
// timestamptz, and in a Redis script's double-precision numbers. Outside
// the range a sum could overflow, or a store would round or refuse it.

// checkTime reports whether t lies in the range every store keeps exactly,
// as an ErrInvalid naming field when it does not.
func checkTime(field string, t time.Time) error {
	if driver.InRange(t) {
		return nil
	}
	return invalidf(field, "%s is outside 1970-01-01 to 2150-01-01 UTC, the instants every store keeps exactly", t.UTC().Format(time.RFC3339Nano))
}
