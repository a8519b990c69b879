package redisstore

// ReplyTTL is how long a write's reply is kept, for the tests.
const ReplyTTL = replyTTL

// QueuedForTest reports how many calls wait for a pipeline.
func (s *Store) QueuedForTest() int { return s.gather.Queued() }

// The scripts' sources, for a test that runs them side by side.
var (
	ApplySource = applySrc
	FastSource  = fastSrc
)
