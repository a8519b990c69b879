package pgstore

import (
	"context"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

var _ driver.StoreClock = (*Store)(nil)

// StoreTime implements driver.StoreClock: the server's
// clock_timestamp(), to the microsecond. One statement, on the Store's
// pool, connection or transaction.
func (s *Store) StoreTime(ctx context.Context) (time.Time, error) {
	t, err := s.q.StoreTime(ctx, s.db)
	if err != nil {
		return time.Time{}, interpretError(err)
	}
	return timeOf(t), nil
}
