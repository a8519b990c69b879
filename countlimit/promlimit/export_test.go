package promlimit

// ReadWithoutLock reports how many rules a decision finds without taking
// the lock (the copy Decided reads first).
func ReadWithoutLock(m *Metrics) int { return len(*m.rules.Load()) }
