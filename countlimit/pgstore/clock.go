package pgstore

import (
	"context"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

var _ countlimit.StoreClock = (*Store)(nil)

// StoreTime implements countlimit.StoreClock: the server's
// clock_timestamp(), to the microsecond. One statement, on the Store's
// pool, connection or transaction.
func (s *Store) StoreTime(ctx context.Context) (time.Time, error) {
	t, err := s.q.StoreTime(ctx, s.db)
	if err != nil {
		return time.Time{}, interpretError(err)
	}
	return timeOf(t), nil
}
