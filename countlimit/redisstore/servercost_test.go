package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// BenchmarkScriptServerCost measures what Redis itself spends on a call
// (its own INFO commandstats, so the client's CPU and the round trips drop
// out) when calls come 32 to a script from 2 goroutines, as the batcher
// sends them at 64 callers (x32), one to a script from one goroutine, as
// one caller sends them (x1), and one to a script in pipelines of 32 from
// 2 goroutines, as a pipelining client of the bare script sends them
// (p32):
//
//   - fast.lua as it ships, each call counting one more in its window (the
//     commonest path: HMGET, then one HSET of the count and the lost-reply
//     record);
//   - fast.lua with the records off (token 0: the HSET writes the count
//     alone);
//   - a floor that decides nothing: the same HMGET and HSET per call, with
//     no arguments, no decision and no replies;
//   - the bare script's INCR+PEXPIRE per call, looped the same way.
//
// calls/s is what the calling goroutines (one or two) got through;
// server-µs/call is Redis's time in EVALSHA over the calls it carried;
// core-calls/s is how many calls one Redis core could do at that cost,
// the most any client could get through it. docs/benchmarks.md, "Redis at
// 16 and 64 callers", has its figures.
func BenchmarkScriptServerCost(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	floor := `for i = 1, #KEYS do
  redis.call('HMGET', KEYS[i], 'c', 'b', 'e', 'x', 's', 'l', 'r')
  redis.call('HSET', KEYS[i], 'c', 1, 'r', 1)
end
return #KEYS`
	bare := `for i = 1, #KEYS do
  redis.call('INCR', KEYS[i])
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return #KEYS`
	prefix := "countlimit-bench:cost:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	var seq atomic.Int64
	// fastCall sends per calls of fast.lua (s) on the hashes named name,
	// with tokens from tok.
	fastCall := func(tok func() string) func(*redis.Script, string, int) func(string) error {
		return func(s *redis.Script, name string, per int) func(string) error {
			return func(string) error {
				keys := make([]string, 0, 2*per)
				args := make([]any, 0, 2+6*per)
				args = append(args, tok(), "0")
				now := time.Now().UnixMicro()
				for i := range per {
					keys = append(keys, prefix+name+":"+benchIDs[i], prefix+name+":log:"+benchIDs[i])
					// now, n, limit, begin, length (0: lifetime), block, span.
					args = append(args, now, 1, int64(1)<<50, now, 0, 0, 0)
				}
				return s.EvalSha(ctx, c, keys, args...).Err()
			}
		}
	}
	guarded := fastCall(func() string { return strconv.FormatInt(seq.Add(1), 10) })
	unguarded := fastCall(func() string { return "0" })
	loopCall := func(s *redis.Script, name string, per int) func(string) error {
		keys := make([]string, per)
		for i := range keys {
			keys[i] = prefix + name + ":" + benchIDs[i]
		}
		return func(string) error { return s.EvalSha(ctx, c, keys, 3600000).Err() }
	}
	// pipeCall sends 32 scripts of one call each in one pipeline: per is
	// the calls a round trip carries, not a script.
	pipeCall := func(s *redis.Script, name string, per int) func(string) error {
		return func(string) error {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range per {
					s.EvalSha(ctx, p, []string{prefix + name + ":" + benchIDs[i]}, 3600000)
				}
				return nil
			})
			return err
		}
	}
	for _, v := range []struct {
		name, src string
		call      func(*redis.Script, string, int) func(string) error
		per       []int
		scripts   int // scripts a round trip carries, when not 1
	}{
		{"fast.lua", redisstore.FastSource, guarded, []int{1, 32}, 0},
		{"fast.lua_records_off", redisstore.FastSource, unguarded, []int{1, 32}, 0},
		{"floor_HMGET+HSET", floor, loopCall, []int{1, 32}, 0},
		{"bare_INCR+PEXPIRE", bare, loopCall, []int{1, 32}, 0},
		{"bare_INCR+PEXPIRE_pipelined", bare, pipeCall, []int{32}, 32},
	} {
		s := redis.NewScript(v.src)
		if err := s.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		for _, per := range v.per {
			call := v.call(s, strings.ReplaceAll(v.name, "+", "_"), per)
			kind := "x"
			if v.scripts > 0 {
				kind = "p"
			}
			b.Run(fmt.Sprintf("%s%d/%s", kind, per, v.name), func(b *testing.B) {
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				ns := runCallers(b, min(per, 2), call)
				b.ReportMetric(1e9/ns*float64(per), "calls/s") // runCallers counted round trips
				usec, scripts := evalshaStats(b, c)
				want := int64(b.N) // scripts sent
				if v.scripts > 0 {
					want *= int64(v.scripts)
				}
				if scripts < want || scripts > want+want/100+2 {
					// The statistics are the server's: another client's scripts
					// would be counted as ours (a stray one or two, say a late
					// call of an earlier benchmark's store, are noise).
					b.Fatalf("INFO commandstats counts %d EVALSHA for %d scripts sent: is another client using this Redis?", scripts, want)
				}
				cost := usec / float64(int64(b.N)*int64(per))
				b.ReportMetric(cost, "server-µs/call")
				b.ReportMetric(1e6/cost, "core-calls/s")
			})
		}
	}
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		if err := c.Del(ctx, keys...).Err(); err != nil {
			b.Log(err)
		}
	}
}

// evalshaStats returns the µs Redis spent in EVALSHA and how many it ran
// since the last CONFIG RESETSTAT.
func evalshaStats(b *testing.B, c *redis.Client) (usec float64, calls int64) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, val, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(val, 10, 64)
			case "usec":
				usec, _ = strconv.ParseFloat(val, 64)
			}
		}
	}
	return usec, calls
}
