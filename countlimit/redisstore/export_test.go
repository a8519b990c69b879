package redisstore

import "time"

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
