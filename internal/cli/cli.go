// Package cli is the countlimit command: it takes arguments and writers, so
// every command is tested in-process.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
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
  countlimit serve [--addr 127.0.0.1:8080] [--store URL] [--rules FILE] [--migrate] [--log-level info]
                   [--token-file FILE] [--insecure] [--metrics-addr ADDR]
                   [--store-timeout 1s] [--breaker-failures 5] [--breaker-cooldown 1s]
  countlimit allow|peek|refund|reset RULE ID [--cost N] [--tier T] [--store URL] [--rules FILE] [--json]
  countlimit top [-n 20] --store postgres://...
  countlimit purge [--batch 1000] --store postgres://...
  countlimit migrate up|down|status --store postgres://...
  countlimit bench [--store URL] [--duration 10s] [--concurrency 16] [--ids 1000] [--rule NAME]
  countlimit bench --baseline --store postgres://... [--duration 5s] [--callers 1,4,16,64] [--ids 10000]
  countlimit rules check FILE
  countlimit rules default
  countlimit help

--store (default $COUNTLIMIT_STORE, else memory) is memory, postgres://... or redis://...
--addr defaults to $COUNTLIMIT_ADDR, else 127.0.0.1:8080 (use :8080 and a token in a container).
--rules is a YAML rule file; without it the built-in rules (the seed scenarios) apply.
serve --token-file FILE (else $COUNTLIMIT_TOKEN; the file wins) sets a bearer token of at
least 16 characters: every endpoint but /healthz then needs "Authorization: Bearer <token>".
serve refuses an --addr beyond loopback (":8080", 0.0.0.0) without a token unless --insecure.
serve --metrics-addr ADDR serves /metrics there, with no token, and not on --addr.
serve starts even when the store does not answer (except with --migrate); /healthz says 503
until it does. A store call that takes over --store-timeout fails (503); after
--breaker-failures failures in a row (0: never) checks answer 503 without calling the store
for --breaker-cooldown, then one probes it.
allow, peek, refund and reset exit 0 when allowed, 1 when denied, 2 on error;
put -- before an ID that starts with "-".
`

// Run runs the command line args (without the program name) and returns the
// exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitError
	}
	var err error
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	case "migrate":
		err = migrate(ctx, args[1:], stdout)
	case "serve":
		err = serve(ctx, args[1:], stdout, stderr)
	case "allow", "peek", "refund", "reset":
		var denied bool
		denied, err = check(ctx, args[0], args[1:], stdout)
		if err == nil && denied {
			return ExitDenied
		}
	case "top":
		err = top(ctx, args[1:], stdout)
	case "purge":
		err = purge(ctx, args[1:], stdout)
	case "bench":
		err = bench(ctx, args[1:], stdout)
	case "rules":
		err = rules(args[1:], stdout)
	default:
		err = usageErrorf("unknown command %q", args[0])
	}
	if err == nil {
		return ExitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "countlimit: ") {
		msg = "countlimit: " + msg
	}
	fmt.Fprintln(stderr, msg)
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprint(stderr, "\n"+usage)
	}
	return ExitError
}

type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// storeFlag adds --store to fs, defaulting to $COUNTLIMIT_STORE.
func storeFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("COUNTLIMIT_STORE")
	if def == "" {
		def = "memory"
	}
	return fs.String("store", def, "store: memory, postgres://... or redis://... (default $COUNTLIMIT_STORE, else memory)")
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return err
	case err != nil:
		return usageErrorf("%s: %v", fs.Name(), err)
	}
	return nil
}

// parseMixed parses flags that may come before, between or after the
// positional arguments, and returns the positional ones.
func parseMixed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
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

func isPostgres(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

// redactURL hides the passwords in a store URL: in its user info and in
// any query parameter whose name holds "password" (password, sslpassword).
func redactURL(raw string) string {
	if !strings.Contains(raw, "://") {
		return raw // "memory", or not a URL at all
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(a URL that does not parse)"
	}
	q := u.Query()
	for k := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			q.Set(k, "xxxxx")
			u.RawQuery = q.Encode()
		}
	}
	return u.Redacted()
}
