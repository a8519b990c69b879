package pgstore

import (
	"context"
	"fmt"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/gather"
)

// AllowBatchForTest sends reqs, in this order, as one group commit and
// writes each request's state: what a batch of concurrent calls does.
func (s *Store) AllowBatchForTest(ctx context.Context, reqs []*countlimit.Request) error {
	calls := make([]*gather.Call, len(reqs))
	for i, r := range reqs {
		calls[i] = &gather.Call{Req: *r}
	}
	s.sendBatch(ctx, calls)
	for i, c := range calls {
		switch {
		case c.Err != nil:
			return c.Err
		case c.Retried():
			return fmt.Errorf("call %d was left for a retry", i)
		}
		reqs[i].Checks[0].State = c.Req.Checks[0].State
	}
	return nil
}

// QueuedForTest reports how many calls wait for a group commit.
func (s *Store) QueuedForTest() int { return s.gather.Queued() }
