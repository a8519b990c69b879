// Package wire is how the stores put a driver.Check's times into the
// numbers their storage keeps: Unix microseconds with a sentinel for the
// zero Time, and the window a check opens as a begin and a length. One home
// for what memstore, pgstore and redisstore would otherwise each spell.
package wire

import (
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// Micros returns t in Unix microseconds, or none for the zero Time.
func Micros(t time.Time, none int64) int64 {
	if t.IsZero() {
		return none
	}
	return t.UnixMicro()
}

// Time returns the time us Unix microseconds after the epoch, or the zero
// Time when us is none: Micros undone.
func Time(us, none int64) time.Time {
	if us == none {
		return time.Time{}
	}
	return time.UnixMicro(us)
}

// Window returns the window a counted event opens for c when the stored one
// is not current, in the form countlimit_apply and apply.lua take it: its
// begin, and its length in microseconds, 0 for a window that never ends
// (End zero). A sliding check (Span > 0) has no such window, its log is its
// window: Window returns the zero Time and 0 for it, whatever c.Begin and
// c.End hold, so that no store sends or depends on them.
func Window(c *driver.Check) (begin time.Time, length int64) {
	switch {
	case c.Span > 0:
		return time.Time{}, 0
	case c.End.IsZero():
		return c.Begin, 0
	}
	return c.Begin, c.End.Sub(c.Begin).Microseconds()
}
