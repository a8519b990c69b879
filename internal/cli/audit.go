package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// openPostgres opens a --store that must be PostgreSQL.
func openPostgres(ctx context.Context, verb, url string) (*opened, error) {
	if !isPostgres(url) {
		return nil, usageErrorf("%s: --store must be a postgres:// URL, got %q (Redis keys expire on their own; memory is per process)", verb, redactURL(url))
	}
	return openStore(ctx, url, false, nil)
}

func top(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("top")
	storeURL := storeFlag(fs)
	n := fs.Int("n", 20, "rows per table")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *n < 1 {
		return usageErrorf("top: -n must be at least 1, got %d", *n)
	}
	st, err := openPostgres(ctx, "top", *storeURL)
	if err != nil {
		return err
	}
	defer st.close()
	sections := []struct {
		title string
		fetch func(context.Context, int) ([]pgstore.Status, error)
	}{
		{"Nearest their limit", st.pg.NearestLimit},
		{"Most denied", st.pg.MostDenied},
		{"Blocked now", st.pg.Blocked},
	}
	for i, sec := range sections {
		rows, err := sec.fetch(ctx, *n)
		if err != nil {
			return fmt.Errorf("top: %w", err)
		}
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
	fs := newFlagSet("purge")
	storeURL := storeFlag(fs)
	batch := fs.Int("batch", 1000, "rows per batch (each batch is one short statement)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *batch < 1 || *batch > 1<<20 {
		return usageErrorf("purge: --batch must be 1 to %d, got %d", 1<<20, *batch)
	}
	st, err := openPostgres(ctx, "purge", *storeURL)
	if err != nil {
		return err
	}
	defer st.close()
	tty := isTerminal(stdout)
	now := time.Now()
	var total int64
	for {
		n, err := st.pg.PurgeBatch(ctx, now, *batch)
		total += n
		if tty {
			fmt.Fprintf(stdout, "\rpurged %d rows", total)
		}
		if err != nil {
			if tty {
				fmt.Fprintln(stdout)
			}
			return err
		}
		if n < int64(*batch) {
			break
		}
	}
	if tty {
		fmt.Fprint(stdout, "\r")
	}
	fmt.Fprintf(stdout, "purged %d expired rows\n", total)
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
