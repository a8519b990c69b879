package gather_test

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/countlimit/countlimit/internal/gather"
	"github.com/countlimit/countlimit/migrations"
)

// TestMaxAttemptsIsTheMigrations holds the copies of "8 attempts"
// together: countlimit_apply and countlimit_acquire loop in PL/pgSQL, which
// cannot read a Go constant, so each spells the bound (and
// countlimit_apply's error names it) that gather.MaxAttempts, and with it
// pgstore's lone statement, keeps to.
func TestMaxAttemptsIsTheMigrations(t *testing.T) {
	t.Parallel()
	bound := regexp.MustCompile(`FOR attempt IN 1 \.\. (\d+) LOOP|created concurrently (\d+) times over`)
	for _, name := range []string{"00001_countlimit.sql", "00002_smooth.sql"} {
		src, err := migrations.FS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
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
}
