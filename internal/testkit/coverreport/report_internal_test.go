package coverreport

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// f is a function as plpgsql_check profiles it:
//
//	1  (blank: prosrc begins with a newline)
//	2  BEGIN
//	3    IF x > 0 THEN
//	4      RETURN 1;
//	5    ELSIF x < -5 THEN
//	6      RETURN 3;
//	7    END IF;
//	8    FOR i IN 1 .. x LOOP
//	9      y := y + 1;
//	10   END LOOP;
//	11   BEGIN
//	12     y := y / x;
//	13   EXCEPTION WHEN division_by_zero THEN
//	14     y := 0;
//	15   END;
//	16   RETURN y;
//	17 END
func f(exec ...int64) Function {
	src := "\nBEGIN\n  IF x > 0 THEN\n    RETURN 1;\n  ELSIF x < -5 THEN\n    RETURN 3;\n  END IF;\n  FOR i IN 1 .. x LOOP\n    y := y + 1;\n  END LOOP;\n" +
		"  BEGIN\n    y := y / x;\n  EXCEPTION WHEN division_by_zero THEN\n    y := 0;\n  END;\n  RETURN y;\nEND"
	st := []Statement{
		{ID: 0, Parent: -1, Line: 2, Name: "statement block"},
		{ID: 1, Parent: 0, ParentNote: "body", Line: 3, Name: "IF"},
		{ID: 2, Parent: 1, ParentNote: "then body", Line: 4, Name: "RETURN"},
		{ID: 3, Parent: 1, ParentNote: "elsif 1", Line: 6, Name: "RETURN"},
		{ID: 4, Parent: 0, ParentNote: "body", Line: 8, Name: "FOR with integer loop variable"},
		{ID: 5, Parent: 4, ParentNote: "loop body", Line: 9, Name: "assignment"},
		{ID: 6, Parent: 0, ParentNote: "body", Line: 11, Name: "statement block"},
		{ID: 7, Parent: 6, ParentNote: "body", Line: 12, Name: "assignment"},
		{ID: 8, Parent: 6, ParentNote: "exception 1", Line: 14, Name: "assignment"},
		{ID: 9, Parent: 0, ParentNote: "body", Line: 16, Name: "RETURN"},
	}
	for i := range st {
		st[i].Exec = exec[i]
	}
	return Function{Signature: "f(integer)", Language: "plpgsql", Source: src, Statements: st}
}

func TestPLpgSQLBranches(t *testing.T) {
	// Called with x = 0 once: no IF condition holds, the loop never runs,
	// the division raises.
	c := PLpgSQL([]Function{f(1, 1, 0, 0, 1, 0, 1, 1, 1, 1)})[0]
	if c.Name != "plpgsql f(integer)" || c.Reached != 2 || c.Total != 5 || c.StmtsReached != 7 || c.Stmts != 10 {
		t.Errorf("got %s branches %d/%d statements %d/%d, want plpgsql f(integer) branches 2/5 statements 7/10",
			c.Name, c.Reached, c.Total, c.StmtsReached, c.Stmts)
	}
	want := []string{
		"line 4: RETURN 1; (then body of IF at line 3)",
		"line 6: RETURN 3; (elsif 1 of IF at line 3)",
		"line 9: y := y + 1; (loop body of FOR with integer loop variable at line 8)",
	}
	if !slices.Equal(c.Never, want) {
		t.Errorf("never reached:\n%s\nwant\n%s", strings.Join(c.Never, "\n"), strings.Join(want, "\n"))
	}
	// A second run with x = 1 adds its counts: the THEN and the loop
	// body, no longer the ELSE that is not written.
	c = PLpgSQL([]Function{f(1, 1, 0, 0, 1, 0, 1, 1, 1, 1), f(1, 1, 1, 0, 0, 0, 0, 0, 0, 0)})[0]
	if c.Reached != 3 || !slices.Contains(c.Never, "line 9: y := y + 1; (loop body of FOR with integer loop variable at line 8)") {
		t.Errorf("merged: branches %d/%d, never %q; want 3 reached, the loop body not", c.Reached, c.Total, c.Never)
	}
	// Every condition held: the ELSE that is not written was never taken.
	c = PLpgSQL([]Function{f(2, 2, 1, 1, 0, 0, 0, 0, 0, 0)})[0]
	if !slices.Contains(c.Never, "line 3: IF x > 0 THEN (no condition holds, no ELSE)") {
		t.Errorf("never %q, want the IF's missing ELSE", c.Never)
	}
	// An IF that never ran is named once, not by its branches.
	c = PLpgSQL([]Function{f(1, 0, 0, 0, 1, 1, 1, 1, 1, 1)})[0]
	if want := []string{"line 3: IF x > 0 THEN (IF never ran)"}; !slices.Equal(c.Never, want) || c.Total != 5 {
		t.Errorf("never %q of %d branches, want %q of 5", c.Never, c.Total, want)
	}
	// A statement after one that raised, in a body that ran.
	g := f(1, 1, 0, 0, 1, 0, 1, 1, 1, 0)
	if c := PLpgSQL([]Function{g})[0]; !slices.Contains(c.Never, "line 16: RETURN y; (RETURN never ran)") {
		t.Errorf("never %q, want the last RETURN", c.Never)
	}
	if c := PLpgSQL([]Function{{Signature: "g()", Language: "sql"}})[0]; c.Name != "sql g()" || c.Total != 0 {
		t.Errorf("a SQL function: %+v", c)
	}
}

func TestCases(t *testing.T) {
	var tally CaseTally
	for _, in := range []string{"s\tnew key\t0\ns\tbusy\t2\n", "s\tnew key\t0\nt\tbusy\t0\n"} {
		if err := Cases(strings.NewReader(in), &tally); err != nil {
			t.Fatal(err)
		}
	}
	got := tally.Copies()
	if len(got) != 2 || got[0].Name != "cases s" || got[0].Reached != 1 || got[0].Total != 2 || !slices.Equal(got[0].Never, []string{"new key"}) ||
		got[1].Reached != 0 || got[1].Total != 1 {
		t.Errorf("got %+v", got)
	}
	if err := Cases(strings.NewReader("s\tx\n"), &tally); err == nil {
		t.Error("a line without a count: no error")
	}
	var lua CaseTally
	if err := Cases(strings.NewReader("fast.lua\tline 3: if x then (then)\t4\nfast.lua\tline 3: if x then (no condition holds, no else)\t0\n"), &lua); err != nil {
		t.Fatal(err)
	}
	if got := lua.Lua(); len(got) != 1 || got[0].Name != "lua fast.lua" || got[0].What != "branches" || got[0].Reached != 1 || got[0].Total != 2 ||
		!slices.Equal(got[0].Never, []string{"line 3: if x then (no condition holds, no else)"}) {
		t.Errorf("Lua: got %+v", got)
	}
}

func TestGoBlocks(t *testing.T) {
	root := t.TempDir()
	src := "package p\n\nfunc F(x int) int {\n\tif x > 0 {\n\t\treturn 1\n\t}\n\tif x < 0 {\n\t\treturn 1\n\t}\n\treturn 0\n}\n"
	if err := os.MkdirAll(filepath.Join(root, "p"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "p", "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	a := "mode: set\nm/p/p.go:3.20,4.11 1 1\nm/p/p.go:4.11,6.3 1 1\nm/p/p.go:7.2,7.11 1 1\nm/p/p.go:7.11,9.3 1 0\nm/p/p.go:10.2,10.10 1 0\n"
	b := "mode: set\nm/p/p.go:3.20,4.11 1 1\nm/p/p.go:4.11,6.3 1 0\nm/p/p.go:7.2,7.11 1 1\nm/p/p.go:7.11,9.3 1 0\nm/p/p.go:10.2,10.10 1 1\n"
	got, err := Go([]io.Reader{strings.NewReader(a), strings.NewReader(b)}, "m", root)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "go p/p.go" || got[0].Reached != 4 || got[0].Total != 5 ||
		!slices.Equal(got[0].Never, []string{"func F: if x < 0 { (its body)"}) {
		t.Errorf("got %+v", got)
	}
}

func TestUnreachableCheck(t *testing.T) {
	u, err := ParseUnreachable(strings.NewReader("# a comment\n\nplpgsql f() | line 3: x | why not\ngo a.go | func F: * | a test helper\ngo a.go | func G: * | gone\ncases s | busy | only under a lock\n"))
	if err != nil {
		t.Fatal(err)
	}
	copies := []Copy{
		{Name: "plpgsql f()", Never: []string{"line 3: x", "line 4: y"}},
		{Name: "go a.go", Never: []string{"func F: x"}},
	}
	unlisted, stale := u.Check(copies)
	if !slices.Equal(unlisted, []string{"plpgsql f() | line 4: y"}) {
		t.Errorf("unlisted %q", unlisted)
	}
	if !slices.Equal(stale, []string{"line 5: go a.go | func G: *: reached", "line 6: cases s: no such copy in the report"}) {
		t.Errorf("stale %q", stale)
	}
	copies = append(copies, Copy{Name: "cases s"})
	if _, stale := u.Check(copies); !slices.Equal(stale, []string{"line 5: go a.go | func G: *: reached", "line 6: cases s | busy: reached"}) {
		t.Errorf("stale %q", stale)
	}
	if _, err := ParseUnreachable(strings.NewReader("f | x\n")); err == nil {
		t.Error("a line without why: no error")
	}
}
