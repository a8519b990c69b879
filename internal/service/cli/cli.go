// Package cli is the countlimit command: it takes arguments and writers, so
// every command is tested in-process.
//
// Operations on named rules (allow, peek, refund, reset, acquire, release,
// extend) go through internal/service/ruleops, as the service's endpoints do; the
// CLI never goes through the HTTP service to reach them. Only serve, which
// starts that service, imports internal/service/server (a test holds this).
// bench is internal/service/bench, which Run calls; what the two share
// (flag sets, usage errors, store URLs) is internal/service/clikit.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/countlimit/countlimit/internal/expose"
	"github.com/countlimit/countlimit/internal/service/bench"
	"github.com/countlimit/countlimit/internal/service/clikit"

	"github.com/countlimit/countlimit/countlimit"
)

// Exit statuses. Operator commands that check a limit exit 0 when allowed
// and 1 when denied, so shell scripts can branch on them.
const (
	ExitOK     = 0
	ExitDenied = 1
	ExitError  = 2
)

const usage = `countlimit: may this event happen once more for this key in this period?

Usage:
  countlimit serve [--addr 127.0.0.1:8080] [--store URL] [--rules FILE] [--migrate] [--token-file FILE] ...
  countlimit allow|peek|refund|reset RULE ID --store URL [--tier T] [--cost N] [--rules FILE] [--json]
  countlimit acquire RULE ID --store URL [--tier T] [--rules FILE] [--json]
  countlimit release|extend LEASE --store URL [--json]
  countlimit top --store postgres://... [-n 20] [--json]
  countlimit purge --store postgres://... [--batch 1000]
  countlimit migrate up|down|status --store postgres://...
  countlimit bench --store URL [--duration 10s] [--callers 16|1,4,16,64] [--ids 1000]
                   [--rule NAME [--tier T]] [--rules FILE] [--json|--csv] [--plot FILE.svg]
  countlimit bench --baseline --store postgres://... [--callers 1,4,16,64] [--duration 5s]
                   [--ids 10000] [--rows existing,new,random] [--table-rows N]
                   [--json|--csv] [--plot FILE.svg]
  countlimit rules check FILE
  countlimit rules default
  countlimit version
  countlimit help [COMMAND]

Run 'countlimit COMMAND -h' for what a command does and all of its flags.

--store is postgres://..., redis://... or memory, and defaults to $COUNTLIMIT_STORE. serve
falls back to memory (counters that live as long as the process); every other command needs
a store named, and allow, peek, refund, reset, acquire, release and extend refuse memory,
which would forget each count when the command exits.
--rules is a YAML rule file; without it the built-in example rules apply
('countlimit rules default' prints them).
allow and acquire exit 0 when allowed and 1 when denied, peek 0 or 1 as the next allow would,
extend 1 when the lease is no longer held; every command exits 2 on an error. Put -- before an ID that starts with "-".
`

// Run runs the command line args (without the program name) and returns the
// exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitError
	}
	var err error
	cmd := args[0]
	switch cmd {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && cmd == "help" && !isHelpFlag(args[1]) {
			if _, ok := commands[args[1]]; ok {
				return Run(ctx, []string{args[1], "-h"}, stdout, stderr)
			}
			err = clikit.UsageErrorf("help: unknown command %q", args[1])
			break
		}
		fmt.Fprint(stdout, usage)
		return ExitOK
	case "version", "-version", "--version":
		cmd = "version"
		err = version(args[1:], stdout)
	case "migrate":
		err = migrate(ctx, args[1:], stdout)
	case "serve":
		err = serve(ctx, args[1:], stdout, stderr)
	case "allow", "peek", "refund", "reset", "acquire":
		var denied bool
		denied, err = check(ctx, cmd, args[1:], stdout)
		if err == nil && denied {
			return ExitDenied
		}
	case "release", "extend":
		var notHeld bool
		notHeld, err = leaseCmd(ctx, cmd, args[1:], stdout)
		if err == nil && notHeld {
			return ExitDenied
		}
	case "top":
		err = top(ctx, args[1:], stdout)
	case "purge":
		err = purge(ctx, args[1:], stdout)
	case "bench":
		err = bench.Run(ctx, args[1:], stdout, stderr, bench.Env{Open: openBenchStore})
	case "rules":
		err = rules(args[1:], stdout)
	default:
		err = clikit.UsageErrorf("unknown command %q", cmd)
	}
	if err == nil {
		return ExitOK
	}
	var he *clikit.HelpRequest
	if errors.As(err, &he) {
		printHelp(stdout, he.FS)
		return ExitOK
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "countlimit: ") {
		msg = "countlimit: " + msg
	}
	fmt.Fprintln(stderr, msg)
	var ue *clikit.UsageError
	if errors.As(err, &ue) && !ue.NoHint {
		if _, ok := commands[cmd]; ok {
			fmt.Fprintf(stderr, "run 'countlimit %s -h' for its %s\n", cmd, commands[cmd].hint())
		} else {
			fmt.Fprintln(stderr, "run 'countlimit help' for the commands")
		}
	}
	return ExitError
}

// leaseKeyFlag adds --lease-key-file to fs and returns a function that
// reads the lease key it names, else $COUNTLIMIT_LEASE_KEY, as Limiter
// options: WithLeaseKey, or none when neither is set. The service and the
// CLI's acquire, release and extend must share the key to take each
// other's leases. Both sources lose one trailing newline (\n or \r\n) and
// nothing else, so a file and a variable holding the same line give the
// same key, and a binary key file keeps its bytes.
func leaseKeyFlag(fs *flag.FlagSet) func() ([]countlimit.Option, error) {
	file := fs.String("lease-key-file", "", "`FILE` holding the key that signs lease strings, at least 16 bytes (beats $COUNTLIMIT_LEASE_KEY)")
	return func() ([]countlimit.Option, error) {
		key, from := os.Getenv("COUNTLIMIT_LEASE_KEY"), "$COUNTLIMIT_LEASE_KEY"
		if *file != "" {
			b, err := os.ReadFile(*file)
			if err != nil {
				return nil, fmt.Errorf("%s: --lease-key-file: %w", fs.Name(), err)
			}
			key, from = string(b), "--lease-key-file "+*file
			if key == "" {
				return nil, fmt.Errorf("%s: %s is empty", fs.Name(), from)
			}
		}
		key = trimNewline(key)
		switch {
		case key == "":
			return nil, nil
		case len(key) < expose.MinLeaseKeyLen:
			return nil, fmt.Errorf("%s: the lease key from %s is %d bytes long, want at least %d (try: openssl rand -hex 32)", fs.Name(), from, len(key), expose.MinLeaseKeyLen)
		}
		return []countlimit.Option{countlimit.WithLeaseKey([]byte(key))}, nil
	}
}

// trimNewline drops one trailing newline, \n or \r\n, from s, and nothing
// else: a lone \r stays.
func trimNewline(s string) string {
	if s, ok := strings.CutSuffix(s, "\n"); ok {
		return strings.TrimSuffix(s, "\r")
	}
	return s
}

// parseMixed parses flags that may come before, between or after the
// positional arguments, and returns the positional ones.
func parseMixed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := clikit.Parse(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// isHelpFlag reports whether arg asks for help: countlimit help -h is
// countlimit help.
func isHelpFlag(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }
