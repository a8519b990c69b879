package promlimit

import "github.com/countlimit/countlimit/countlimit"

// ReadWithoutLock reports how many rules a decision finds without taking
// the lock (the copy a decision reads first).
func ReadWithoutLock(m *Metrics) int { return len(*m.rules.Load()) }

// Decided tells m's observer a decision under rule, as a Limiter tells one
// under its rule's use type, and as the service tells one under the rule
// or group a request names.
func (m *Metrics) Decided(rule string, allowed bool) {
	m.Observer().Decided(countlimit.Decision{UseType: countlimit.UseType(rule), Allowed: allowed})
}
