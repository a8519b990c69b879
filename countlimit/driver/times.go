package driver

import "time"

// The instants a Limiter works with, and a store is asked to purge by,
// lie from the Unix epoch until 2150-01-01 UTC (excluded); see
// countlimit's WithClock and CheckLimit.
const (
	minUnix = 0          // 1970-01-01T00:00:00Z
	maxUnix = 5680281600 // 2150-01-01T00:00:00Z, excluded
)

// InRange reports whether t lies from 1970-01-01 until 2150-01-01 UTC: the
// instants every store keeps exactly, with room for a window or a penalty
// of up to 100 years after them.
func InRange(t time.Time) bool {
	s := t.Unix()
	return s >= minUnix && s < maxUnix
}
