// Package clikit is what the countlimit command's subcommands share, in
// internal/service/cli and in internal/service/bench: their flag sets and
// the errors that tell the command to print a usage hint or a command's
// help, the --store flag and what is said of a store URL, and the rule
// file of --rules.
package clikit

import (
	"errors"
	"flag"
	"fmt"
	"io"
	neturl "net/url"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/countlimit/countlimit/internal/service/rulefile"
)

// UsageError is a command line the command cannot run: the command prints
// it with a hint pointing at the command's help, unless NoHint says the
// message already tells what to do.
type UsageError struct {
	Msg    string
	NoHint bool
}

func (e *UsageError) Error() string { return e.Msg }

// UsageErrorf is a UsageError with a hint.
func UsageErrorf(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// HelpRequest is what Parse returns for -h: the command prints the help
// of the command FS parses.
type HelpRequest struct{ FS *flag.FlagSet }

func (h *HelpRequest) Error() string { return "help requested" }

// NewFlagSet returns the flag set of the command name, which prints
// nothing itself: Parse's errors say what went wrong.
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// Parse parses args with fs: -h is a HelpRequest, a bad flag a
// UsageError.
func Parse(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return &HelpRequest{fs}
	case err != nil:
		return UsageErrorf("%s: %v", fs.Name(), err)
	}
	return nil
}

// IsSet reports whether the flag name was given on the command line.
func IsSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// StoreFlag adds --store to fs. The func it returns, called once fs is
// parsed, gives the store's URL: --store, else $COUNTLIMIT_STORE, else
// fallback. With no fallback ("") a store is required: neither set is a
// usage error naming both, and want says what the command takes.
func StoreFlag(fs *flag.FlagSet, fallback, want string) func() (string, error) {
	def := "$COUNTLIMIT_STORE"
	if fallback != "" {
		def += ", else " + fallback
	}
	u := fs.String("store", "", "the store `URL`: "+want+" (default "+def+")")
	return func() (string, error) {
		switch {
		case *u != "":
			return *u, nil
		case os.Getenv("COUNTLIMIT_STORE") != "":
			return os.Getenv("COUNTLIMIT_STORE"), nil
		case fallback != "":
			return fallback, nil
		}
		return "", &UsageError{NoHint: true, Msg: fmt.Sprintf("%s: no store: pass --store %s, or set $COUNTLIMIT_STORE", fs.Name(), want)}
	}
}

// IsPostgres reports whether url names a PostgreSQL store.
func IsPostgres(url string) bool {
	return strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://")
}

// RedactURL hides the passwords in a store URL: in its user info and in
// any query parameter whose name holds "password" (password, sslpassword).
func RedactURL(raw string) string {
	if !strings.Contains(raw, "://") {
		return raw // "memory", or not a URL at all
	}
	u, err := neturl.Parse(raw)
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

// BadStoreURL is the error for a --store URL that its driver rejects. The
// drivers' errors quote the URL: net/url's (so go-redis's) as given,
// password and all; pgx's with the passwords masked only as well as a
// broken URL lets it. So the quoted URL is cut out, and the only URL shown
// is RedactURL's.
func BadStoreURL(rawURL string, err error) error {
	msg := err.Error()
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		s := pe.Error()
		if rest, ok := strings.CutPrefix(s, "cannot parse `"); ok {
			if _, reason, ok := strings.Cut(rest, "`: "); ok {
				msg = strings.ReplaceAll(msg, s, "cannot parse: "+reason)
			}
		}
	}
	var ue *neturl.Error
	if errors.As(err, &ue) {
		msg = strings.ReplaceAll(msg, ue.Error(), ue.Err.Error())
	}
	msg = strings.ReplaceAll(msg, strconv.Quote(rawURL), "the URL")
	msg = strings.ReplaceAll(msg, rawURL, "the URL")
	return UsageErrorf("--store %s: %s", RedactURL(rawURL), msg)
}

// LoadRules loads the rule file of --rules: the built-in example rules
// when path is "".
func LoadRules(path string) (*rulefile.File, error) {
	if path == "" {
		return rulefile.Default(), nil
	}
	return rulefile.Load(path)
}

// Plural returns "1 rule" or "n rules".
func Plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
