package gather_test

import (
	"io/fs"
	"regexp"
	"strconv"
	"testing"

	"github.com/countlimit/countlimit/internal/store/gather"
	"github.com/countlimit/countlimit/migrations"
)

// TestMaxAttemptsIsTheMigrations holds the copies of "8 attempts"
// together: countlimit_apply and countlimit_acquire loop in PL/pgSQL, which
// cannot read a Go constant, so each spells the bound (and
// countlimit_apply's error names it) that gather.MaxAttempts, and with it
// pgstore's lone statement, keeps to. Every migration that creates one of
// them is read.
func TestMaxAttemptsIsTheMigrations(t *testing.T) {
	t.Parallel()
	bound := regexp.MustCompile(`FOR attempt IN 1 \.\. (\d+) LOOP|created concurrently (\d+) times over`)
	loops := regexp.MustCompile(`CREATE (OR REPLACE )?FUNCTION (countlimit_apply|countlimit_acquire)\(`)
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for _, name := range names {
		src, err := migrations.FS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !loops.Match(src) {
			continue
		}
		read++
		ms := bound.FindAllSubmatch(src, -1)
		if len(ms) == 0 {
			t.Errorf("%s has no loop of attempts", name)
		}
		for _, m := range ms {
			n, _ := strconv.Atoi(string(m[1]) + string(m[2]))
			if n != gather.MaxAttempts {
				t.Errorf("%s: %q, want gather.MaxAttempts = %d", name, m[0], gather.MaxAttempts)
			}
		}
	}
	if read < 2 {
		t.Errorf("%d migrations create countlimit_apply or countlimit_acquire, want v0.1.0's and the one that adds countlimit_apply's smooth overload", read)
	}
}
