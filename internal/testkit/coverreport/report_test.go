//go:build unix

package coverreport_test

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/internal/testkit/coverreport"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/pgcluster"
)

// EnvReport asks for TestReport: it runs the model tests of two stores
// again, several minutes.
const EnvReport = "COUNTLIMIT_COVER_REPORT"

// TestReport runs the model tests of memstore, pgstore and redisstore
// (TestModel, COUNTLIMIT_MODEL_STEPS steps, default 2000, for each seed of
// COUNTLIMIT_COVER_SEEDS, default "1 2", so that the report is the same
// on every run) with Go's coverage of countlimit/driver, internal/testkit/model
// and countlimit/memstore, pgstore's on a private PostgreSQL cluster that
// loads plpgsql_check with its profiler on, and redisstore's on the test
// Redis (COUNTLIMIT_TEST_REDIS_URL) with the test build of its scripts
// (luacover), which tallies their branches in the test process's own
// database; it prints the report, and
// fails on every branch never reached that unreachable.txt does not list,
// and on every entry of the list that names a branch reached.
//
// COUNTLIMIT_COVER_DIR keeps what the model tests wrote (profiles and
// tallies) in that directory; COUNTLIMIT_COVER_FROM reads them from one
// instead of running the tests, to print the report again.
func TestReport(t *testing.T) {
	if os.Getenv(EnvReport) == "" {
		t.Skipf("set %s=1 to run the model tests with coverage and print the report", EnvReport)
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	dir := os.Getenv("COUNTLIMIT_COVER_FROM")
	if dir == "" {
		dir = cmp.Or(os.Getenv("COUNTLIMIT_COVER_DIR"), t.TempDir())
		runModelTests(t, root, dir)
	}
	report(t, root, dir)
}

// runModelTests runs the model tests with coverage, writing what they
// measure into dir.
func runModelTests(t *testing.T, root, dir string) {
	t.Helper()
	bin, err := pgcluster.Bin()
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL's server binaries", err)
	}
	lib, err := pgcluster.LibDir(bin)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL's pg_config", err)
	}
	if _, err := os.Stat(filepath.Join(lib, "plpgsql_check.so")); err != nil {
		testenv.Unavailable(t, "plpgsql_check (apt-get install postgresql-15-plpgsql-check)", err)
	}
	c := pgcluster.Start(t, bin, "shared_preload_libraries = 'plpgsql, plpgsql_check'\nplpgsql_check.profiler = on\n"+
		"plpgsql_check.profiler_max_shared_chunks = 100000\nfsync = off\nsynchronous_commit = off")
	url := c.URL("postgres")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE EXTENSION plpgsql_check SCHEMA public"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	steps := cmp.Or(os.Getenv("COUNTLIMIT_MODEL_STEPS"), "2000")
	seeds := strings.Fields(cmp.Or(os.Getenv("COUNTLIMIT_COVER_SEEDS"), "1 2"))
	for _, seed := range seeds {
		start := time.Now()
		cmd := exec.Command("go", "test", "-count=1", "-timeout=60m", "-run", "^TestModel$",
			"-coverpkg=./countlimit/driver,./internal/testkit/model,./countlimit/memstore", "-coverprofile="+filepath.Join(dir, "go-"+seed+".out"),
			"./countlimit/memstore", "./countlimit/pgstore", "./countlimit/redisstore")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "COUNTLIMIT_TEST_POSTGRES_URL="+url, "COUNTLIMIT_REQUIRE_BACKENDS=1",
			"COUNTLIMIT_MODEL_SEED="+seed, "COUNTLIMIT_MODEL_STEPS="+steps, modeltest.EnvCover+"="+dir)
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Run(); err != nil {
			t.Fatalf("seed %s: the model tests failed (%v):\n%s", seed, err, buf.String())
		}
		t.Logf("seed %s, %s steps: the model tests took %v", seed, steps, time.Since(start).Round(time.Second))
	}
}

// report prints the report of what the model tests wrote into dir, and
// holds it to unreachable.txt.
func report(t *testing.T, root, dir string) {
	t.Helper()
	var copies []coverreport.Copy
	fns, err := readProfiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) == 0 {
		t.Fatal("pgstore's TestModel wrote no profile")
	}
	copies = append(copies, coverreport.PLpgSQL(fns)...)
	tally := readTallies(t, dir, "cases-*.tsv")
	cases := tally.Copies()
	if len(cases) == 0 {
		t.Fatal("no model test tallied its statements' cases")
	}
	copies = append(copies, cases...)
	lua := readTallies(t, dir, "lua-*.tsv")
	if len(lua.Lua()) == 0 {
		t.Fatal("redisstore's TestModel tallied no branch of its scripts")
	}
	copies = append(copies, lua.Lua()...)
	profiles, _ := filepath.Glob(filepath.Join(dir, "go-*.out"))
	var readers []io.Reader
	for _, p := range profiles {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, bytes.NewReader(b))
	}
	gocopies, err := coverreport.Go(readers, "github.com/countlimit/countlimit", root)
	if err != nil {
		t.Fatal(err)
	}
	copies = append(copies, gocopies...)

	list, err := os.ReadFile("unreachable.txt")
	if err != nil {
		t.Fatal(err)
	}
	u, err := coverreport.ParseUnreachable(bytes.NewReader(list))
	if err != nil {
		t.Fatalf("unreachable.txt: %v", err)
	}
	var report bytes.Buffer
	coverreport.Write(&report, copies, u)
	os.Stdout.Write(report.Bytes())
	unlisted, stale := u.Check(copies)
	for _, b := range unlisted {
		t.Errorf("never reached, and not listed in unreachable.txt: %s", b)
	}
	for _, s := range stale {
		t.Errorf("unreachable.txt %s", s)
	}
}

// readTallies reads the tallies of every file in dir that matches
// pattern (coverreport.Cases' lines).
func readTallies(t *testing.T, dir, pattern string) *coverreport.CaseTally {
	t.Helper()
	var tally coverreport.CaseTally
	files, _ := filepath.Glob(filepath.Join(dir, pattern))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := coverreport.Cases(bytes.NewReader(b), &tally); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return &tally
}

// readProfiles reads every profile pgstore's TestModel wrote into dir.
func readProfiles(dir string) ([]coverreport.Function, error) {
	files, err := filepath.Glob(filepath.Join(dir, "plpgsql-*.json"))
	if err != nil {
		return nil, err
	}
	var out []coverreport.Function
	for _, f := range files {
		fns, err := coverreport.ReadProfile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, fns...)
	}
	return out, nil
}
