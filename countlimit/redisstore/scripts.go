package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts' files. Go puts before each script that reads or writes a
// counter hash the grace every TTL carries (GRACE, ms) and, but for
// fast.lua, smoothkey.lua (a smooth key may be kept as a string);
// fast.lua takes smoothkey.lua at its own line "-- smoothkey.lua", below
// its commonest smooth call (see fast.lua).
var (
	//go:embed smoothkey.lua
	smoothKeyFile string
	//go:embed apply.lua
	applyFile string
	//go:embed fast.lua
	fastFile string
	//go:embed lease.lua
	leaseFile string
	//go:embed reset.lua
	resetFile string
)

// script is one Lua script as a Store sends it: its source, for EVAL, and
// its SHA1, for EVALSHA, boxed once.
type script struct {
	src string
	sha any
}

func newScript(src string) script { return script{src, redis.NewScript(src).Hash()} }

// scripts are the scripts a Store sends: apply.lua, fast.lua, lease.lua
// and reset.lua, each made whole.
type scripts struct {
	apply, fast, lease, reset script
}

// build says how the scripts are made from their files: the grace every
// TTL carries, whether the lost-reply records are off (a script's token
// taken as "0", see apply.lua), and what is done to each file first (nil:
// nothing). Every Store has builtScripts but one a test builds otherwise
// (export_test.go), which holds scripts of its own.
type build struct {
	grace     time.Duration
	unguarded bool
	file      func(name, src string) string
}

// builtScripts are the scripts of every Store a program makes: made once,
// never changed.
var builtScripts = newScripts(build{grace: expiryGrace})

// newScripts makes the scripts as b says.
func newScripts(b build) *scripts {
	file := func(name, src string) string {
		if b.file != nil {
			return b.file(name, src)
		}
		return src
	}
	grace := fmt.Sprintf("local GRACE = %d -- ms: redisstore.go, expiryGrace\n", b.grace.Milliseconds())
	smooth := file("smoothkey.lua", smoothKeyFile)
	apply, fast := file("apply.lua", applyFile), file("fast.lua", fastFile)
	if b.unguarded {
		const off = "local tok = '0' -- the records off (a test's build)\n"
		apply = spliced(apply, "\nlocal tok = ARGV[4]\n", "\n"+off)
		fast = spliced(fast, "\nlocal tok = ARGV[1]\n", "\n"+off)
	}
	return &scripts{
		apply: newScript(grace + smooth + apply),
		fast:  newScript(grace + spliced(fast, "\n-- smoothkey.lua\n", "\n"+smooth)),
		lease: newScript(grace + smooth + file("lease.lua", leaseFile)),
		reset: newScript(file("reset.lua", resetFile)),
	}
}

// spliced returns src with its one line at (with the newlines around it)
// made with; it panics when src holds that line other than once.
func spliced(src, at, with string) string {
	if strings.Count(src, at) != 1 {
		panic(fmt.Sprintf("redisstore: a script holds %q %d times, want once", strings.TrimSpace(at), strings.Count(src, at)))
	}
	return strings.Replace(src, at, with, 1)
}

// withSource returns cmd again as an EVAL of its script's source, for a
// server that answered NOSCRIPT.
func (sc *scripts) withSource(ctx context.Context, cmd redis.Cmder) redis.Cmder {
	args := append([]any(nil), cmd.Args()...)
	args[0] = "eval"
	var at *attempt
	for i, a := range args {
		// The EVALSHA answered NOSCRIPT ran nothing: its EVAL is a repeat
		// only where an earlier send of it may have run (a lost reply,
		// then a SCRIPT FLUSH).
		if old, ok := a.(*attempt); ok {
			at = old.successor()
			args[i] = at
		}
	}
	var out redis.Cmder
	if args[1] == sc.reset.sha {
		args[1] = sc.reset.src
		c := redis.NewIntCmd(ctx, args...)
		c.SetFirstKeyPos(3)
		out = c
	} else {
		switch cmd.Args()[1] {
		case sc.apply.sha:
			args[1] = sc.apply.src
		case sc.fast.sha:
			args[1] = sc.fast.src
		case sc.lease.sha:
			args[1] = sc.lease.src
		}
		c := redis.NewIntSliceCmd(ctx, args...)
		c.SetFirstKeyPos(3)
		out = c
	}
	if at != nil {
		at.carry(out)
	}
	return out
}
