package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/countlimit/countlimit/countlimit/memstore"
)

// command is what "countlimit CMD -h" says about a command besides its
// flags: how it is called and what it does.
type command struct {
	usage    string // one or more lines, each a way to call it
	about    string
	flagless bool
}

// hint names what "countlimit CMD -h" shows, for the hint under a usage
// error.
func (c command) hint() string {
	if c.flagless {
		return "usage"
	}
	return "flags"
}

const checkAbout = `
RULE is a rule or a group of the rule file; %s.
The store must be postgres://... or redis://... (memory would forget the
count when the command exits).
Exit status: 0 %s 2 on an error.`

// commands holds the help of every command, by name.
var commands = map[string]command{
	"serve": {
		usage: "countlimit serve [flags]",
		about: `Serves the HTTP API (POST /v1/allow, /v1/peek, /v1/refund, /v1/reset,
/v1/acquire, /v1/release, /v1/extend; GET /v1/rules, /healthz, /metrics) with
the rules of --rules, or the built-in example rules. With neither --store nor $COUNTLIMIT_STORE the counters live
in memory, as long as the process, in at most ` + fmt.Sprint(memstore.DefaultMaxBytes>>20) + ` MiB of heap
whatever the ids: beyond it, checks that need a new counter answer 503.

--token-file FILE (else $COUNTLIMIT_TOKEN; the file wins) sets a bearer token
of at least 16 characters: every endpoint but /healthz then needs
"Authorization: Bearer <token>". serve refuses an --addr beyond loopback
(":8080", 0.0.0.0) without a token unless --insecure. --metrics-addr serves
/metrics there, with no token, and not on --addr.

serve starts even when the store does not answer (except with --migrate);
/healthz says 503 until it does. On a PostgreSQL schema that lacks
migrations of this release it starts too: /healthz and checks say 503,
naming the migrations missing and "countlimit migrate up", until the schema
is migrated (asked at each /healthz, and at most once a second from checks).
On Redis, /healthz also says 503 while its maxmemory-policy is not
noeviction: a Redis that evicts keys can drop counters and over-admit (serve
logs it at start). A Redis that persists nothing (neither AOF nor RDB
snapshots) forgets every count when it restarts: serve logs it at start and
/healthz lists it under "warnings", staying 200; --require-redis-persistence
makes it a 503. A store call that takes over --store-timeout fails (503);
after --breaker-failures failures in a row (0: never) checks answer 503
without calling the store for --breaker-cooldown, then one probes it. SIGINT
or SIGTERM drains and stops it; a second one stops it at once.

--max-conns caps the open HTTP connections: each holds a file, and a process
out of files accepts nothing. At the cap a new connection closes the
connection idle longest, else the one longest without a whole request
(silent, or sending its request line, headers or body), passing over one
whose client has sent what serve has yet to read. A request whose handler is
at work is never closed; when every connection is at work a new one is
refused at once (503, Connection: close). 0, the default, is the file limit
(RLIMIT_NOFILE) less the store's pool and an eighth of the limit (at least
64) for the rest of the process, never below a quarter of the limit; no cap
where the system sets no file limit. The "serving" log line says the cap.

On PostgreSQL, serve purges expired rows and leases in the background: a
pass at start, then about every --purge-interval (0: never), each in
statements of at most --purge-batch rows that skip rows live checks hold,
pausing between statements. Each pass logs one line (rows, batches, took);
/metrics counts them (countlimit_purged_rows_total, countlimit_purge_*). A
pass that fails is logged and the next tries again; it never fails a check
or opens the breaker. Several services may purge one database at once.
With --purge-interval 0, purge some other way ("countlimit purge" from
cron, or pg_cron: see docs/operations.md), or count_limit keeps a row for
every id it ever saw. Memory and Redis counters expire on their own: there
the purge flags do nothing.`,
	},
	"allow": {
		usage: "countlimit allow RULE ID --store URL [flags]",
		about: "Counts one event (--cost N: N events) for ID under RULE, if it fits.\n" +
			fmt.Sprintf(checkAbout, "a group's rules are counted all-or-nothing", "when allowed, 1 when denied,"),
	},
	"peek": {
		usage: "countlimit peek RULE ID --store URL [flags]",
		about: "Shows ID's count under RULE and whether an allow would pass, counting nothing.\n" +
			fmt.Sprintf(checkAbout, "a group shows every rule", "when the next allow would pass, 1 when it would be denied,"),
	},
	"refund": {
		usage: "countlimit refund RULE ID --store URL [flags]",
		about: "Gives --cost events (default 1) back to ID's current window under RULE\n" +
			"(the SMS was never sent), never going below 0; a penalty stays.\n" +
			fmt.Sprintf(checkAbout, "a group's rules each get the events back", "once refunded,"),
	},
	"reset": {
		usage: "countlimit reset RULE ID --store URL [flags]",
		about: "Forgets ID's count and penalty under RULE (every rule of a group);\n" +
			"it needs no tier.\n" +
			fmt.Sprintf(checkAbout, "every rule of a group is forgotten", "once forgotten,"),
	},
	"acquire": {
		usage: "countlimit acquire RULE ID --store URL [flags]",
		about: `Takes a slot of RULE, a rule with a concurrent window, for ID if one is free,
and prints the lease: the string release and extend take. A lease not
released frees itself when the rule's ttl has passed since it was taken or
last extended. When denied it prints the slots held and when the earliest
lease expires.
The store must be postgres://... or redis://... (memory would forget the
lease when the command exits). Exit status: 0 when allowed, 1 when denied,
2 on an error.`,
	},
	"release": {
		usage: "countlimit release LEASE --store URL [flags]",
		about: `Gives back the slot of LEASE, the string acquire printed. Releasing a lease
that was already released, or that expired, is not an error and frees
nothing else; a malformed or edited lease is, and so is one whose rule is
not in --rules or has another ttl now. Exit status: 0 once released, 2 on
an error.`,
	},
	"extend": {
		usage: "countlimit extend LEASE --store URL [flags]",
		about: `Keeps the slot of LEASE, the string acquire printed, for the rule's ttl from
now: the ttl of its rule in --rules, which the lease string must match. A
lease that expired (its slot may be someone else's now) or was released is
not held: extend says so and exits 1; acquire a new one.
Exit status: 0 when extended, 1 when not held, 2 on an error.`,
	},
	"top": {
		usage: "countlimit top --store postgres://... [flags]",
		about: `Prints three tables from the count_limit_status view: the counters nearest
their limit, the most denied, and the ids blocked now (PostgreSQL only:
Redis keeps no index to rank by, memory lives in one process).`,
	},
	"purge": {
		usage: "countlimit purge --store postgres://... [flags]",
		about: `Deletes expired rows and leases in batches, each one short statement with
SKIP LOCKED, so it runs beside live traffic; on a terminal it shows its
progress. "countlimit serve" does the same by itself (its --purge-interval);
run this from cron where no serve purges. PostgreSQL only: Redis keys
expire on their own.`,
	},
	"migrate": {
		usage: "countlimit migrate up|down|status --store postgres://...",
		about: `Applies every pending migration (up), rolls the latest back (down), or lists
them (status). The version table is countlimit_goose_version; concurrent
runs wait for each other.`,
	},
	"bench": {
		usage: `countlimit bench --store URL [flags]
  countlimit bench --baseline --store postgres://... [flags]`,
		about: `Runs concurrent Allow calls against a store and reports calls/s and latency.
--rule checks a rule of the rule file (--tier T for a rule with tiers), or a
group with AllowAll; by default it checks a fixed 1m window no call fills.
--callers takes a list (1,4,16,64): one run per number of callers.
Its counters have use types of their own ("bench.<random>..."), never yours,
and are deleted at the end; --store memory measures the library alone.

--baseline (PostgreSQL) runs a hand-written fixed-window upsert and Allow
alternately, at each number of --callers, each side for --duration (default
5s) in all, in rounds of upsert, Allow, Allow, upsert of 1-2s each: on rows
that exist (--ids ids, each counted once first, and one hot id), and on new
ids (each cell from TRUNCATE with autovacuum off, every call on an id of its
own; Allow's calls/s in the first and the last fifth of its time show
whether it slows as the table grows); --rows existing or --rows new runs one
of the two. --rows random (not run by default) draws every call's id at
random from --ids, each cell's tables from TRUNCATE and ANALYZE, so that it
starts with inserts and turns into updates; it runs its series twice in a
row and reports both. --rows existing --table-rows N fills both tables with
N rows first (VACUUM ANALYZE and a CHECKPOINT, bytes a row on disk printed)
and draws every call's id at random from them: how the cost grows with the
table. It works in a schema of its own, dropped at the end, and never
touches the database's count_limit.

--json or --csv print the results for machines (one record per run and
side, latencies in seconds) while the table goes to stderr; --plot FILE.svg
also draws throughput and p50/p99 latency against callers.`,
	},
	"rules": {
		usage: `countlimit rules check FILE
  countlimit rules default`,
		about: `check validates a rule file: errors name the file, line and field.
default prints the built-in example rules, a starting point for a file of
your own.`,
		flagless: true,
	},
	"version": {
		usage: "countlimit version",
		about: `Prints the module version, and the VCS revision the binary was built from
(with "modified" when the checkout had changes).`,
		flagless: true,
	},
}

// printHelp prints the help of the command fs parses: its usage, what it
// does and its flags.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	c := commands[fs.Name()]
	fmt.Fprintf(w, "Usage:\n  %s\n\n%s\n", c.usage, c.about)
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if !hasFlags {
		return
	}
	fmt.Fprint(w, "\nFlags:\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if len(f.Name) == 1 {
			name = "-" + f.Name
		}
		if arg != "" {
			name += " " + arg
		}
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			if !strings.Contains(text, "(default") {
				text += " (default " + f.DefValue + ")"
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, text)
	})
	tw.Flush()
}
