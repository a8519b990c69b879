// A call as the scripts take it: the keys and arguments of each script,
// several calls combined into one, and the replies read back.

package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/gather"
	"github.com/countlimit/countlimit/internal/store/wire"
	"github.com/redis/go-redis/v9"
)

// finishAlone is finish for cmd, r's command of its own, with its logs.
func finishAlone(r *driver.Request, cmd redis.Cmder) error {
	done, err := finish(r, cmd, 0, 1)
	if !done {
		return errLogAgain
	}
	return err
}

// combined appends to cmds fast.lua scripts for the fast-path calls of
// calls, in their order, each of at most maxCalls calls and, but for its
// first call, maxBytes of keys and arguments, and a command for each other
// call. It returns which command each call is (of), its place in it (at),
// and how many calls each command carries (size); of is nil when no script
// would carry two calls.
func (sc *scripts) combined(ctx context.Context, cmds []redis.Cmder, calls []*gather.Call, maxCalls, maxBytes int) (_ []redis.Cmder, of, at, size []int32) {
	nfast := 0
	for _, c := range calls {
		if isFast(&c.Req) {
			nfast++
		}
	}
	if nfast < 2 {
		return cmds, nil, nil, nil
	}
	all := make([]int32, 2*len(calls)+len(calls))
	of, at, size = all[:len(calls)], all[len(calls):2*len(calls)], all[2*len(calls):2*len(calls)]
	fast := make([]*driver.Request, 0, min(nfast, maxCalls))
	bytes, open := 0, -1 // the script being filled: its bytes, its command
	flush := func() {
		if open >= 0 {
			cmds[open] = sc.fastCommand(ctx, true, fast...) // one server: no slot migrates
			fast, open = fast[:0], -1
		}
	}
	for i, c := range calls {
		if !isFast(&c.Req) {
			of[i] = int32(len(cmds))
			cmds = append(cmds, sc.command(ctx, &c.Req, true))
			size = append(size, 1)
			continue
		}
		b := fastBytes(&c.Req)
		if open >= 0 && (len(fast) == maxCalls || bytes+b > maxBytes) {
			flush()
		}
		if open < 0 {
			open, bytes = len(cmds), 0
			cmds = append(cmds, nil) // filled by flush
			size = append(size, 0)
		}
		of[i], at[i] = int32(open), int32(len(fast))
		fast = append(fast, &c.Req)
		size[open]++
		bytes += b
	}
	flush()
	return cmds, of, at, size
}

// fastBytes is about what r adds to a fast.lua script: its two keys and its
// arguments.
func fastBytes(r *driver.Request) int {
	return 2*(logKeyLen(string(r.Checks[0].UseType), r.ID)) + 7*12
}

// command returns the EVALSHA of r's script: lease.lua for leases (see
// lease.go), reset.lua for a reset, fast.lua for an Allow of one rule,
// else apply.lua (see each for its KEYS and ARGV). With logs it names every
// check's sliding log, else only those the call needs (see appendKeys).
func (sc *scripts) command(ctx context.Context, r *driver.Request, logs bool) redis.Cmder {
	if r.OnLeases() {
		return sc.leaseCommand(ctx, r)
	}
	if isFast(r) {
		return sc.fastCommand(ctx, logs, r)
	}
	return sc.applyCommand(ctx, r, logs)
}

// applyCommand returns the EVALSHA of r, not on leases, for reset.lua (a
// reset) or apply.lua (any other op, whatever its rules); logs as for
// command.
func (sc *scripts) applyCommand(ctx context.Context, r *driver.Request, logs bool) redis.Cmder {
	reset := r.Op == driver.OpReset
	nkeys := 2 * len(r.Checks)
	if reset {
		nkeys++
	}
	nargs := 5 + 5*len(r.Checks)
	if reset {
		nargs = 2
	}
	args := make([]any, 3, 3+nkeys+nargs)
	args[0], args[2] = "evalsha", nkeys
	args = appendKeys(args, r, reset, logs)
	var cmd redis.Cmder
	if reset {
		args[1] = sc.reset.sha
		args = withLeaseKeys(args, r)
		at := newAttempt() // which reset.lua does not read (see Store.moving)
		args = append(args, replyMS, at)
		c := redis.NewIntCmd(ctx, args...)
		c.SetFirstKeyPos(3)
		cmd = at.carry(c)
	} else {
		args[1] = sc.apply.sha
		tok := noToken
		if r.Op != driver.OpPeek {
			tok = token()
		}
		at := newAttempt()
		args = append(args, opArg[r.Op], r.Now.UnixMicro(), r.N, tok, at)
		for i := range r.Checks {
			c := &r.Checks[i]
			begin, length, span := shape(c)
			args = append(args, c.Limit, begin, length, span, c.Block.Microseconds())
		}
		c := redis.NewIntSliceCmd(ctx, args...)
		c.SetFirstKeyPos(3)
		cmd = at.carry(c)
	}
	return cmd
}

// shape returns what the scripts take for c's kind of window: its begin
// (µs), its length (µs; 0 = lifetime) and its sliding span (µs; 0 = not
// sliding), or for a Smooth check its burst, its emission interval (µs)
// and span -1 (see apply.lua).
func shape(c *driver.Check) (begin, length, span int64) {
	if c.Smooth() {
		return c.Burst, c.Interval.Microseconds(), -1
	}
	b, l := wire.Window(c)
	return wire.Micros(b, 0), l, c.Span.Microseconds()
}

// isFast reports whether r is fast.lua's: an Allow of one rule.
func isFast(r *driver.Request) bool {
	return r.Op == driver.OpAllow && len(r.Checks) == 1 && !r.OnLeases()
}

// fastCommand is fast.lua's EVALSHA for rs, Allows of one rule, applied in
// order under one token; logs as for command.
func (sc *scripts) fastCommand(ctx context.Context, logs bool, rs ...*driver.Request) redis.Cmder {
	args := make([]any, 3, 3+2*len(rs)+2+7*len(rs))
	args[0], args[1], args[2] = "evalsha", sc.fast.sha, 2*len(rs)
	for _, r := range rs {
		args = appendKeys(args, r, false, logs)
	}
	at := newAttempt()
	args = append(args, token(), at)
	for _, r := range rs {
		c := &r.Checks[0]
		begin, length, span := shape(c)
		args = append(args, r.Now.UnixMicro(), r.N, c.Limit, begin, length, c.Block.Microseconds(), span)
	}
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	return at.carry(cmd)
}

// appendKeys appends r's keys to args: each check's counter and log, then,
// when reply is set (a Reset), a reply key for the call (see the package
// doc), in the id's slot. No Key starts with "countlimit:{": a use type is never empty.
// The keys are cut from one string, one allocation.
//
// Without logs (on a Cluster, see the package doc) a check's log is named
// only where the call needs it: for a sliding check, for a Refund and for a
// Reset, which deletes it; every other check names its counter twice in
// the log's place, which Redis counts as one key. A script that finds a
// log there all the same (field s: a sliding rule counted in the hash)
// asks for it, having written nothing (see finish).
func appendKeys(args []any, r *driver.Request, reply, logs bool) []any {
	id := escape(r.ID)
	var seq [13]byte
	var tok []byte
	if reply {
		tok = strconv.AppendUint(seq[:0], callSeq.Add(1), 36)
	}
	var one [1]string
	uts := one[:0] // the checks' use types, escaped once
	n := 0
	for i := range r.Checks {
		uts = append(uts, escape(string(r.Checks[i].UseType)))
		n += logKeyLen(uts[i], id)
	}
	if reply {
		n += replyKeyLen(id, tok)
	}
	var b strings.Builder
	b.Grow(n)
	for _, ut := range uts {
		writeLogKey(&b, ut, id)
	}
	if reply {
		writeReplyKey(&b, id, tok)
	}
	all := b.String()
	at := 0
	logs = logs || reply || r.Op == driver.OpRefund
	for i, ut := range uts {
		logLen := logKeyLen(ut, id)
		log := all[at : at+logLen]
		counter := log[:len(log)-len(logSuffix)]
		if logs || r.Checks[i].Span > 0 {
			args = append(args, counter, log)
		} else {
			args = append(args, counter, counter)
		}
		at += logLen
	}
	if reply {
		args = append(args, all[at:])
	}
	return args
}

func replyKeyLen(id string, tok []byte) int {
	return len("countlimit:{}:reply:") + len(id) + len(callPrefix) + len(tok)
}

// writeReplyKey writes the reply key of an escaped id and a call's token.
func writeReplyKey(b *strings.Builder, id string, tok []byte) {
	b.WriteString("countlimit:{")
	b.WriteString(id)
	b.WriteString("}:reply:")
	b.WriteString(callPrefix)
	b.Write(tok)
}

// finish writes the reply of cmd, of k calls (k > 1: a combined fast.lua
// script), for its pos-th call, r, into r's check states. It returns false,
// and sets nothing, for a call that a combined script left undone or that
// asks for its sliding logs (see appendKeys): the script wrote nothing for
// it, and it goes again with its logs.
func finish(r *driver.Request, cmd redis.Cmder, pos, k int) (done bool, err error) {
	if err := cmd.Err(); err != nil {
		return true, err
	}
	c, ok := cmd.(*redis.IntSliceCmd)
	if !ok {
		return true, nil // a reset: nothing to report
	}
	out := c.Val()
	n := 5*len(r.Checks) + 1
	if len(out) != k*n {
		return true, fmt.Errorf("the script returned %d values for %d calls of %d checks, want %d", len(out), k, len(r.Checks), k*n)
	}
	out = out[pos*n : (pos+1)*n]
	if (k > 1 && out[n-1] == -1) || out[n-1] == needsLogs {
		return false, nil
	}
	if out[n-1] == -2 {
		return true, errLost
	}
	allowed := out[n-1] == 1
	for i := range r.Checks {
		v := out[5*i : 5*i+5]
		r.Checks[i].State = driver.State{
			Allowed:      allowed,
			Used:         v[0],
			Begin:        windowBegin(v[1]),
			End:          wire.Time(v[2], none),
			BlockedUntil: wire.Time(v[3], none),
			FreeAt:       wire.Time(v[4], none),
		}
	}
	return true, nil
}

// none is apply.lua's NONE: no time.
const none = -1 << 53

// windowBegin is a window's begin from a script's reply: zero for none and for
// 0, the epoch, where a smooth key's window begins (apply.lua), which is
// no time to the driver either (a window joined from a smooth key has no
// begin of its own).
func windowBegin(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return wire.Time(us, none)
}

// needsLogs is the verdict of a call that was sent without a sliding log
// its hash has (see appendKeys).
const needsLogs = -3
