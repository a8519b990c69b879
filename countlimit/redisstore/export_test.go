package redisstore

import (
	"context"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// ReplyTTL is how long a Reset's reply is kept, for the tests.
const ReplyTTL = replyTTL

// SetUnguarded turns the lost-reply records off (true) or on, for every
// Store of the process: a test shows what they protect against.
func SetUnguarded(off bool) { unguarded.Store(off) }

// QueuedForTest reports how many calls wait for a pipeline.
func (s *Store) QueuedForTest() int { return s.gather.Queued() }

// The scripts' sources, for a test that runs them side by side.
var (
	ApplySource = applySrc
	FastSource  = fastSrc
)

// SetPolicyClock makes CheckEviction read the time from now.
func SetPolicyClock(s *Store, now func() time.Time) { s.now = now }

// PipelineForTest sends reqs together in one pipeline, in their order, as
// concurrent callers' calls would leave.
func (s *Store) PipelineForTest(ctx context.Context, reqs []*driver.Request) error {
	return s.pipeline(ctx, reqs)
}
