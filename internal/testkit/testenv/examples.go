package testenv

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// MainNeeding is Main for a package whose examples need a server that find
// looks for (FindPostgres, FindRedis). An example cannot skip itself, so
// where there is no server and none is required, the examples are left out
// of the run (by adding ^Example to -test.skip) with a note saying why, as
// the tests skip; under COUNTLIMIT_REQUIRE_BACKENDS=1 they run, and fail.
func MainNeeding(m *testing.M, what string, find func() (string, error)) {
	flag.Parse()
	if _, err := find(); err != nil && !Required() {
		skip := "^Example"
		if f := flag.Lookup("test.skip"); f != nil {
			if cur := f.Value.String(); cur != "" {
				skip = cur + "|" + skip
			}
			_ = f.Value.Set(skip)
		}
		fmt.Fprintf(os.Stderr, "skipping examples: %s unavailable: %v\n", what, err)
	}
	Main(m)
}

// ExampleTB returns the testing.TB an example passes to the helpers where a
// test would pass its *testing.T. Its cleanups run at Cleanup (Main), its
// failures and skips panic with their message, which fails the example.
func ExampleTB() testing.TB { return exampleTB{} }

type exampleTB struct {
	testing.TB // only for the unexported method; every method used is below
}

func (exampleTB) Helper()                   {}
func (exampleTB) Name() string              { return "Example" }
func (exampleTB) Cleanup(f func())          { AtExit(f) }
func (exampleTB) Log(args ...any)           { fmt.Fprintln(os.Stderr, args...) }
func (exampleTB) Logf(f string, a ...any)   { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (exampleTB) Failed() bool              { return false }
func (exampleTB) Error(args ...any)         { panic(fmt.Sprint(args...)) }
func (exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (exampleTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (exampleTB) Skip(args ...any)          { panic(fmt.Sprint(args...)) }
func (exampleTB) Skipf(f string, a ...any)  { panic(fmt.Sprintf(f, a...)) }
func (exampleTB) FailNow()                  { panic("FailNow") }
func (exampleTB) SkipNow()                  { panic("SkipNow") }
