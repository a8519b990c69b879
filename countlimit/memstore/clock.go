package memstore

import (
	"context"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

var _ driver.StoreClock = (*Store)(nil)

// StoreTime implements driver.StoreClock with this process's clock, so
// that a Limiter configured with countlimit.WithStoreClock works on any
// store; for a memstore it changes nothing.
func (s *Store) StoreTime(context.Context) (time.Time, error) {
	return time.Now().Truncate(time.Microsecond), nil
}
