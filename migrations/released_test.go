package migrations_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/migrations"
)

var release = flag.String("release", "", "record the migrations no release holds yet as released in this version (vX.Y.Z) in released.txt")

// released is a line of released.txt: a migration file, the release that
// first held it, and the SHA-256 of its text then.
type released struct {
	file, version, sum string
}

func readReleased(t *testing.T) []released {
	t.Helper()
	f, err := os.Open("released.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []released
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			t.Fatalf("released.txt:%d: want FILE VERSION SHA256, got %q", n, line)
		}
		out = append(out, released{fields[0], fields[1], fields[2]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sum(t *testing.T, file string) string {
	t.Helper()
	b, err := fs.ReadFile(migrations.FS, file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func number(file string) int {
	n, _ := strconv.Atoi(strings.SplitN(file, "_", 2)[0])
	return n
}

// TestReleasedMigrationsAreUnchanged holds every migration a release
// holds to the checksum recorded when it was released (released.txt): a
// released migration is never edited, a change is a new migration. New
// migrations come after every released one. At a release, record the new
// ones (docs/RELEASING.md):
//
//	go test ./migrations -run TestReleasedMigrationsAreUnchanged -release vX.Y.Z
func TestReleasedMigrationsAreUnchanged(t *testing.T) {
	rs := readReleased(t)
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	last := 0
	for _, r := range rs {
		if !slices.Contains(files, r.file) {
			t.Errorf("%s, released in %s, is gone: a released migration is never removed", r.file, r.version)
			continue
		}
		if got := sum(t, r.file); got != r.sum {
			t.Errorf("%s was released in %s and has changed since (SHA-256 %s, recorded %s): a released migration is never edited; put the change in a new migration",
				r.file, r.version, got, r.sum)
		}
		last = max(last, number(r.file))
	}
	var unreleased []string
	for _, f := range files {
		if !slices.ContainsFunc(rs, func(r released) bool { return r.file == f }) {
			unreleased = append(unreleased, f)
			if number(f) <= last {
				t.Errorf("%s is numbered before a released migration: new migrations come after %05d", f, last)
			}
		}
	}
	if *release == "" || len(unreleased) == 0 {
		return
	}
	out, err := os.OpenFile("released.txt", os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for _, f := range unreleased {
		if _, err := fmt.Fprintf(out, "%s %s %s\n", f, *release, sum(t, f)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("recorded %v as released in %s", unreleased, *release)
}
