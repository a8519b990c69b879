package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

var _ driver.StoreClock = (*Store)(nil)

// StoreTime implements driver.StoreClock with Redis's TIME, to the
// microsecond. On a Cluster it asks whichever node the client picks: run
// the nodes' clocks in sync (NTP), as Redis's own expiry needs anyway.
func (s *Store) StoreTime(ctx context.Context) (time.Time, error) {
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return time.Time{}, wrap(fmt.Errorf("TIME: %w", err))
	}
	return t.Truncate(time.Microsecond), nil
}
