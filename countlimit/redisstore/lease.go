package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// leaseKey returns the key of the leases beside counterKey(useType, id): a sorted
// set of lease tokens scored by their expiry (Unix µs), which expires with
// its latest lease. It shares the hash tag, and so the Cluster slot, of
// counterKey(useType, id).
func leaseKey(useType countlimit.UseType, id string) string {
	return counterKey(useType, id) + leaseSuffix
}

const leaseSuffix = ":lease"

// leaseOpArg names r.Op for lease.lua.
var leaseOpArg = [...]any{driver.OpPeek: "peek", driver.OpAcquire: "acquire", driver.OpRelease: "release", driver.OpExtend: "extend"}

// leaseCommand returns the EVALSHA of lease.lua for r (see it for KEYS and
// ARGV). It names no reply key: the lease's token makes a repeat harmless
// (see lease.lua).
func (sc *scripts) leaseCommand(ctx context.Context, r *driver.Request) redis.Cmder {
	c := &r.Checks[0]
	key := counterKey(countlimit.UseType(c.UseType), r.ID)
	cmd := redis.NewIntSliceCmd(ctx, "evalsha", sc.lease.sha, 2, key, key+leaseSuffix,
		leaseOpArg[r.Op], r.Now.UnixMicro(), r.Lease, c.Limit, c.TTL.Microseconds(), c.Block.Microseconds())
	cmd.SetFirstKeyPos(3)
	return cmd
}

// withLeaseKeys adds the lease set of each of r's checks to the keys of
// reset.lua's args (the checks' hashes and logs, then the reply key, which
// stays last), so a reset forgets leases too.
func withLeaseKeys(args []any, r *driver.Request) []any {
	reply := args[len(args)-1]
	args = args[:len(args)-1]
	for i := range r.Checks {
		args = append(args, args[3+2*i].(string)+leaseSuffix)
	}
	args[2] = args[2].(int) + len(r.Checks)
	return append(args, reply)
}
