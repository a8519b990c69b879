package redisstore

import (
	"context"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/gather"
	"github.com/redis/go-redis/v9"
)

// Key, LogKey and LeaseKey return the keys of a counter, its sliding log
// and its leases, for the tests that read them.
func Key(useType countlimit.UseType, id string) string      { return counterKey(useType, id) }
func LogKey(useType countlimit.UseType, id string) string   { return logKey(useType, id) }
func LeaseKey(useType countlimit.UseType, id string) string { return leaseKey(useType, id) }

// ReplyTTL is how long a Reset's reply is kept, for the tests.
const ReplyTTL = replyTTL

// MaxCall and BoundFresh are the bound of a call whose context has none,
// and how long one shared bound serves new calls (bound.go).
const (
	MaxCall    = maxCall
	BoundFresh = boundFresh
)

// WithUnguarded builds the Store's scripts with the lost-reply records
// off: a test shows what they protect against.
func WithUnguarded() Option {
	return func(c *config) { c.testBuild().unguarded = true }
}

// WithPaddedTTLs builds the Store's scripts to give each key they expire
// pad more time to live than its end calls for (a grace of ExpiryGrace +
// pad). A test whose clock is not the real one (internal/testkit/modeltest's,
// which moves seconds ahead in a microsecond, or stops 1 µs before a
// window ends) would otherwise see Redis drop a key, in real time, whose
// window its own clock has not yet seen end. A key kept past its end is
// what the scripts meet anyway when the Limiter's clock runs behind
// Redis's: they decide by the times in it.
func WithPaddedTTLs(pad time.Duration) Option {
	return func(c *config) { c.testBuild().grace = expiryGrace + pad }
}

// WithScriptFiles builds the Store's scripts from each file (apply.lua,
// fast.lua, lease.lua, reset.lua, smoothkey.lua) as file returns it, given
// its name and source: an instrumented build, say.
func WithScriptFiles(file func(name, src string) string) Option {
	return func(c *config) { c.testBuild().file = file }
}

// ScriptFiles are the scripts' files, by name.
var ScriptFiles = map[string]string{
	"apply.lua": applyFile, "fast.lua": fastFile, "lease.lua": leaseFile,
	"reset.lua": resetFile, "smoothkey.lua": smoothKeyFile,
}

func (c *config) testBuild() *build {
	if c.build == nil {
		c.build = &build{grace: expiryGrace}
	}
	return c.build
}

// QueuedForTest reports how many calls wait for a pipeline.
func (s *Store) QueuedForTest() int { return s.gather.Queued() }

// The scripts' sources, as every Store but a test's sends them, for a
// test that runs them side by side.
var (
	ApplySource = builtScripts.apply.src
	FastSource  = builtScripts.fast.src
)

// SetPolicyClock makes CheckEviction read the time from now.
func SetPolicyClock(s *Store, now func() time.Time) { s.now = now }

// PipelineForTest sends reqs together in one pipeline, in their order, as
// concurrent callers' calls would leave.
func (s *Store) PipelineForTest(ctx context.Context, reqs []*driver.Request) error {
	return s.pipeline(ctx, reqs)
}

// CombinedForTest sends reqs in one pipeline as the Store sends a batch of
// concurrent calls on one server: its Allows of one rule together in
// combined fast.lua scripts, every other call a script of its own.
func (s *Store) CombinedForTest(ctx context.Context, reqs []*driver.Request) error {
	calls := make([]gather.Call, len(reqs))
	ptrs := make([]*gather.Call, len(reqs))
	for i, r := range reqs {
		calls[i].Req = *r // shares r.Checks: the states land there
		ptrs[i] = &calls[i]
	}
	s.run(ctx, ptrs, true)
	for i := range calls {
		if err := calls[i].Err; err != nil {
			return wrap(err)
		}
	}
	return nil
}

// ApplyForTest sends r, not on leases, through apply.lua (reset.lua for a
// reset) whatever its rule, as a script of its own: what an Allow of one
// rule would meet if fast.lua did not take it.
func (s *Store) ApplyForTest(ctx context.Context, r *driver.Request) error {
	return s.alone(ctx, r, func(logs bool) redis.Cmder { return s.scripts.applyCommand(ctx, r, logs) })
}

// FastForTest sends r, an Allow of one rule, as the Store sends a call
// that goes alone (fast.lua's EVALSHA), and reads its reply into r's
// states, without the Batcher: the script and the round trip alone.
func (s *Store) FastForTest(ctx context.Context, r *driver.Request) error {
	return s.alone(ctx, r, func(logs bool) redis.Cmder { return s.scripts.fastCommand(ctx, logs, r) })
}

// alone sends r's one command, as command(logs) makes it, and reads its
// reply into r's states: on a Cluster first with the logs the call needs,
// then, if the script asks for its logs, with every one, as the Store does.
func (s *Store) alone(ctx context.Context, r *driver.Request, command func(logs bool) redis.Cmder) error {
	cmds := []redis.Cmder{command(s.cluster == nil)}
	s.execLoading(ctx, cmds) // cmds[0] is then the EVAL if the server had no script
	done, err := finish(r, cmds[0], 0, 1)
	if !done {
		cmds[0] = command(true)
		s.execLoading(ctx, cmds)
		err = finishAlone(r, cmds[0])
	}
	return wrap(err)
}

// ExpiryGrace is how long every key the scripts expire outlives its end.
const ExpiryGrace = expiryGrace
