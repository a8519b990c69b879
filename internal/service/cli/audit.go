package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/db"
	"github.com/countlimit/countlimit/internal/service/audit"
	"github.com/countlimit/countlimit/internal/service/clikit"
)

// openPostgres opens the --store that must be PostgreSQL.
func openPostgres(ctx context.Context, verb string, storeURL func() (string, error)) (*opened, error) {
	url, err := storeURL()
	if err != nil {
		return nil, err
	}
	if !clikit.IsPostgres(url) {
		return nil, clikit.UsageErrorf("%s: --store must be a postgres:// URL, got %q (Redis keys expire on their own; memory is per process)", verb, clikit.RedactURL(url))
	}
	return openStore(ctx, url, false, nil)
}

func top(ctx context.Context, args []string, stdout io.Writer) error {
	fs := clikit.NewFlagSet("top")
	storeURL := clikit.StoreFlag(fs, "", "postgres://...")
	n := fs.Int("n", 20, "`N` rows per table")
	asJSON := fs.Bool("json", false, "print the three tables as one JSON object")
	if err := clikit.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return clikit.UsageErrorf("top: unexpected argument %q", fs.Arg(0))
	}
	if *n < 1 {
		return clikit.UsageErrorf("top: -n must be at least 1, got %d", *n)
	}
	st, err := openPostgres(ctx, "top", storeURL)
	if err != nil {
		return err
	}
	defer st.close()
	sections := []struct {
		title, key string
		fetch      func(context.Context, db.DBTX, int) ([]audit.Status, error)
	}{
		{"Nearest their limit", "nearest_limit", audit.NearestLimit},
		{"Most denied", "most_denied", audit.MostDenied},
		{"Blocked now", "blocked", audit.Blocked},
	}
	all := make([][]audit.Status, len(sections))
	for i, sec := range sections {
		if all[i], err = sec.fetch(ctx, st.pool, *n); err != nil {
			return fmt.Errorf("top: %w", err)
		}
	}
	if *asJSON {
		out := map[string][]topRow{}
		for i, sec := range sections {
			out[sec.key] = make([]topRow, len(all[i]))
			for j, r := range all[i] {
				out[sec.key][j] = newTopRow(r)
			}
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		_, err := fmt.Fprintln(stdout, string(b))
		return err
	}
	for i, sec := range sections {
		rows := all[i]
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "%s (%d)\n", sec.title, len(rows))
		if len(rows) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "USE TYPE\tID\tUSED\tLIMIT\tLEFT\tDENIED\tRESETS IN\tBLOCKED FOR")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", printable(r.UseType), printable(r.UniqueID), r.Used, r.Limit, r.Remaining, r.Denied,
				human(r.ResetsIn), human(r.BlockedFor))
		}
		tw.Flush()
	}
	return nil
}

// topRow is one counter in top --json: the columns of count_limit_status,
// times in UTC, durations in seconds, null where a counter has none.
type topRow struct {
	UseType           string     `json:"use_type"`
	UniqueID          string     `json:"unique_id"`
	WindowKind        string     `json:"window_kind"`
	Used              int64      `json:"used"`
	Limit             int64      `json:"limit"`
	Remaining         int64      `json:"remaining"`
	Denied            int64      `json:"denied"`
	WindowBegin       *time.Time `json:"window_begin"`
	WindowEnd         *time.Time `json:"window_end"`
	ResetsInSeconds   float64    `json:"resets_in_seconds"`
	Blocked           bool       `json:"blocked"`
	BlockedUntil      *time.Time `json:"blocked_until"`
	BlockedForSeconds float64    `json:"blocked_for_seconds"`
	UpdatedAt         *time.Time `json:"updated_at"`
}

func newTopRow(s audit.Status) topRow {
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	return topRow{
		UseType: s.UseType, UniqueID: s.UniqueID, WindowKind: s.WindowKind,
		Used: s.Used, Limit: s.Limit, Remaining: s.Remaining, Denied: s.Denied,
		WindowBegin: at(s.WindowBegin), WindowEnd: at(s.WindowEnd), ResetsInSeconds: s.ResetsIn.Seconds(),
		Blocked: s.Blocked, BlockedUntil: at(s.BlockedUntil), BlockedForSeconds: s.BlockedFor.Seconds(),
		UpdatedAt: at(s.UpdatedAt),
	}
}

// printable quotes s when it holds anything but printable characters, so an
// id a caller chose cannot break the table or send escapes to the terminal.
func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

func human(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Second).String()
}

func purge(ctx context.Context, args []string, stdout io.Writer) error {
	fs := clikit.NewFlagSet("purge")
	storeURL := clikit.StoreFlag(fs, "", "postgres://...")
	batch := fs.Int("batch", pgstore.DefaultPurgeBatchSize, "`N` rows per batch (each batch is one short statement)")
	if err := clikit.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return clikit.UsageErrorf("purge: unexpected argument %q", fs.Arg(0))
	}
	if *batch < 1 || *batch > pgstore.MaxBatchSize {
		return clikit.UsageErrorf("purge: --batch must be 1 to %d, got %d", pgstore.MaxBatchSize, *batch)
	}
	st, err := openPostgres(ctx, "purge", storeURL)
	if err != nil {
		return err
	}
	defer st.close()
	tty := isTerminal(stdout)
	var progress func(int64)
	if tty {
		progress = func(total int64) { fmt.Fprintf(stdout, "\rpurged %s", clikit.Plural(int(total), "row", "rows")) }
	}
	total, err := st.pg.PurgeEach(ctx, time.Now(), *batch, progress)
	if tty {
		fmt.Fprint(stdout, "\r")
	}
	if err != nil {
		if tty {
			fmt.Fprintln(stdout)
		}
		return err
	}
	fmt.Fprintf(stdout, "purged %s\n", clikit.Plural(int(total), "expired row", "expired rows"))
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
