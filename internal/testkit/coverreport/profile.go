// Package coverreport measures which branches of every copy of the
// decision (docs/ARCHITECTURE.md, "The copies") the model harness
// (internal/testkit/modeltest) reaches, and prints a report a reviewer reads: per
// PL/pgSQL function, per statement of the fast path (by the cases it
// decides), per file of redisstore's Lua scripts (luacover) and per Go
// file, the share of branches reached and the branches never reached.
// TestReport runs the model tests of memstore, pgstore (on a private
// PostgreSQL cluster with plpgsql_check's profiler) and redisstore (on
// the test Redis, with the scripts' test build), prints the report, and fails on a branch never reached that
// unreachable.txt does not list (or one it lists that is reached):
//
//	COUNTLIMIT_COVER_REPORT=1 go test -count=1 -v -run '^TestReport$' ./internal/testkit/coverreport
package coverreport

import (
	"encoding/json"
	"fmt"
	"os"
)

// Function is what plpgsql_check's profiler counted of one function of
// countlimit's schema over a run (plpgsql_profiler_function_statements_tb),
// as a model test writes it (pgstore's TestModel, with
// modeltest.EnvCover set): its signature, language and source, and each
// statement's executions. A function in SQL, not PL/pgSQL, has no
// statements the profiler counts.
type Function struct {
	Signature  string      `json:"signature"` // regprocedure: name(argument types)
	Language   string      `json:"language"`  // plpgsql or sql
	Source     string      `json:"source"`    // prosrc: the body, line 1 its first line
	Statements []Statement `json:"statements"`
}

// Statement is one statement of a PL/pgSQL function, as the profiler
// numbers it.
type Statement struct {
	ID         int    `json:"id"`
	Parent     int    `json:"parent"`      // -1 for the function's block
	ParentNote string `json:"parent_note"` // "then body", "else body", "elsif 1", "loop body"...
	Line       int    `json:"line"`        // in Source, from 1
	Name       string `json:"name"`        // IF, RETURN QUERY, assignment...
	Exec       int64  `json:"exec"`
}

// ProfileFile is the name of the file a test process writes its
// functions' profiles to, in the directory modeltest.EnvCover names.
func ProfileFile(pid int) string { return fmt.Sprintf("plpgsql-%d.json", pid) }

// ReadProfile reads the functions' profiles a test process wrote to file.
func ReadProfile(file string) ([]Function, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var fns []Function
	if err := json.Unmarshal(b, &fns); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return fns, nil
}

// LuaFile is the name of the file a test process writes its Lua scripts'
// branch tallies to (redisstore's TestModel, with modeltest.EnvCover
// set), in the directory modeltest.EnvCover names: a line
// "file<TAB>branch<TAB>count" for every branch of every script file
// (internal/testkit/coverreport/luacover), 0 for one never reached.
func LuaFile(pid int) string { return fmt.Sprintf("lua-%d.tsv", pid) }
