package countlimit

import (
	"archive/zip"
	"cmp"
	"go/build"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"
	_ "time/tzdata" // every zone on every machine: none of the tests below skips
)

// zoneNames lists every zone of the Go tz database, from the zoneinfo.zip
// of the Go that runs the tests (time/tzdata embeds the same file, and
// names no zone).
func zoneNames(t *testing.T) []string {
	t.Helper()
	name := filepath.Join(build.Default.GOROOT, "lib", "time", "zoneinfo.zip")
	z, err := zip.OpenReader(name)
	if err != nil {
		t.Fatalf("the list of zones: %v (GOROOT %q)", err, build.Default.GOROOT)
	}
	defer z.Close()
	var names []string
	for _, f := range z.File {
		names = append(names, f.Name)
	}
	if len(names) < 400 {
		t.Fatalf("%s lists %d zones; the tz database has about 600", name, len(names))
	}
	return names
}

type date struct {
	y int
	m time.Month
	d int
}

func dateOf(u time.Time, loc *time.Location) date {
	y, m, d := u.In(loc).Date()
	return date{y, m, d}
}

func (a date) before(b date) bool {
	if a.y != b.y {
		return a.y < b.y
	}
	if a.m != b.m {
		return a.m < b.m
	}
	return a.d < b.d
}

// firstInstant checks that b is the first instant whose local date in loc
// is day or later, from the definition and nothing else: b reads day or
// later, and no instant before it does. Within one zone period the local
// clock only moves forward, so "no instant before b" needs checking only
// at the last instant of each period that ends in the 40 hours before b
// (no clock is ever that far from UTC), and at b's last microsecond. It
// returns what is wrong, or "".
func firstInstant(b time.Time, loc *time.Location, day date) string {
	if got := dateOf(b, loc); got.before(day) {
		return "it reads " + b.In(loc).Format(time.DateTime)
	}
	last := []time.Time{b.Add(-time.Microsecond)}
	for u := b.Add(-40 * time.Hour); ; {
		end := periodEnd(u.In(loc), loc)
		if end.IsZero() || !end.Before(b) {
			break
		}
		last = append(last, end.Add(-time.Microsecond))
		u = end
	}
	for _, u := range last {
		if !dateOf(u, loc).before(day) {
			return u.UTC().Format(time.RFC3339Nano) + ", earlier, reads " + u.In(loc).Format(time.DateTime)
		}
	}
	return ""
}

// TestCalendarPeriodsBeginAtTheirFirstInstant holds Calendar windows in
// every zone of the Go tz database, every unit, 1970-2060, to the
// definition: a day, week, month or year begins at the first instant whose
// local date is its first day (where midnight happens twice, the first;
// where it does not happen, the change), and ends where the next begins.
// The oracle (firstInstant) checks that property directly, with no
// time.Date normalisation.
//
// The days checked in each zone: the day before, of and after every change
// of its clock (so every Day, Week, Month and Year boundary a change could
// move), and, as a sample of the rest, in every third year (a different
// third for each zone, so that the zones together cover every year) its
// January 1st, the first of one month and the Monday of one week. Away
// from a change a zone's offset is one number for days, and the boundary
// follows from it: the sample guards the arithmetic of dates. And the last
// day of every leap year from 2036 on, with the next day, where the time
// package's ZoneBounds errs (see periodEnd). It takes a few seconds under
// -race.
func TestCalendarPeriodsBeginAtTheirFirstInstant(t *testing.T) {
	from := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	to := time.Date(2061, 1, 1, 0, 0, 0, 0, time.UTC)
	checked, wrong := 0, 0
	for zi, name := range zoneNames(t) {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatalf("zone %s: %v", name, err)
		}
		days := map[date]bool{}
		for u := from; ; {
			end := periodEnd(u.In(loc), loc)
			if end.IsZero() || !end.Before(to) {
				break
			}
			for k := -1; k <= 1; k++ {
				y, m, d := end.In(loc).AddDate(0, 0, k).Date()
				days[date{y, m, d}] = true
			}
			u = end
		}
		// The last day of a leap year, past the zones' listed changes,
		// where ZoneBounds ends a period early (see periodEnd).
		for y := 2036; y < to.Year(); y += 4 {
			days[date{y, time.December, 31}] = true
			days[date{y + 1, time.January, 1}] = true
		}
		for y := from.Year() + zi%3; y < to.Year(); y += 3 {
			days[date{y, time.January, 1}] = true
			days[date{y, time.Month(1 + (y+zi)%12), 1}] = true
			mon := time.Date(y, time.Month(1+(y+zi+6)%12), 10, 12, 0, 0, 0, time.UTC)
			mon = mon.AddDate(0, 0, -((int(mon.Weekday()) + 6) % 7))
			days[date{y, mon.Month(), mon.Day()}] = true
		}
		for _, day := range slices.SortedFunc(maps.Keys(days), func(a, b date) int {
			return cmp.Or(cmp.Compare(a.y, b.y), cmp.Compare(a.m, b.m), cmp.Compare(a.d, b.d))
		}) {
			noon := time.Date(day.y, day.m, day.d, 12, 0, 0, 0, time.UTC)
			units := []Unit{Day}
			if noon.Weekday() == time.Monday {
				units = append(units, Week)
			}
			if day.d == 1 {
				units = append(units, Month)
			}
			if day.d == 1 && day.m == time.January {
				units = append(units, Year)
			}
			for _, u := range units {
				checked++
				w := Calendar(u, loc)
				// From two days before, which no clock reads as day, step
				// from window to window until one ends on day or later:
				// that end is where the implementation begins day's period.
				_, b := bounds(time.Date(day.y, day.m, day.d, 0, 0, 0, 0, time.UTC).Add(-48*time.Hour), w)
				for i := 0; dateOf(b, loc).before(day); i++ {
					next, end := bounds(b, w)
					if i == 4 || !end.After(b) {
						t.Fatalf("%s %v: the window of %s is [%s, %s)", name, u, b.UTC().Format(time.RFC3339), next.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339))
					}
					b = end
				}
				if why := firstInstant(b, loc, day); why != "" {
					wrong++
					if wrong <= 20 {
						t.Errorf("%s %v: the period of %d-%02d-%02d begins at %s: %s", name, u, day.y, day.m, day.d, b.UTC().Format(time.RFC3339), why)
					}
					continue
				}
				if begin, _ := bounds(b, w); !begin.Equal(b) {
					wrong++
					if wrong <= 20 {
						t.Errorf("%s %v: the window before %d-%02d-%02d ends at %s, the one that holds that instant begins at %s",
							name, u, day.y, day.m, day.d, b.UTC().Format(time.RFC3339), begin.UTC().Format(time.RFC3339))
					}
				}
			}
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d period boundaries wrong", wrong, checked)
	}
	t.Logf("%d period boundaries checked", checked)
}
