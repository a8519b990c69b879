package coverreport

import (
	"bufio"
	"cmp"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Copy is one copy of the decision, or a part of one, as the report
// gives it: a PL/pgSQL function (its statements and branches), a SQL
// function, a statement of the fast path (the cases it decides), a Lua
// script's file (its branches, luacover's) or a Go file (its blocks).
type Copy struct {
	// Name is "plpgsql <signature>", "sql <signature>",
	// "cases <statement>", "lua <file>" or "go <file>".
	Name string
	// What counts the branches: "branches", "cases" or "blocks".
	What           string
	Reached, Total int
	// Statements reached and in all, for a PL/pgSQL function.
	StmtsReached, Stmts int
	// Never are the branches never reached, in the copy's order: for a
	// PL/pgSQL function, its branches and the first statements of
	// reached bodies that never ran.
	Never []string
}

// Share is the share of branches reached, in percent.
func (c *Copy) Share() float64 {
	if c.Total == 0 {
		return 100
	}
	return 100 * float64(c.Reached) / float64(c.Total)
}

// PLpgSQL returns a Copy per function of fns, the profiles of one or
// more runs (a function's statements counted over them all), sorted by
// signature. A PL/pgSQL function's branches are the bodies of its IF and
// CASE statements (THEN, each ELSIF or WHEN, and ELSE, written or not:
// an IF without one takes it when no condition holds), its loops' bodies
// and its exception handlers; a body is reached when its first statement
// ran, an ELSE not written when the IF ran more often than its bodies.
// A SQL function has none the profiler counts: its Copy has no branches,
// and the report says where its cases are tallied, if anywhere.
func PLpgSQL(fns []Function) []Copy {
	merged := map[string]*Function{}
	var order []string
	for _, f := range fns {
		m, ok := merged[f.Signature]
		if !ok {
			c := f
			c.Statements = slices.Clone(f.Statements)
			merged[f.Signature] = &c
			order = append(order, f.Signature)
			continue
		}
		for _, s := range f.Statements {
			if i := slices.IndexFunc(m.Statements, func(x Statement) bool { return x.ID == s.ID }); i >= 0 {
				m.Statements[i].Exec += s.Exec
			}
		}
	}
	slices.Sort(order)
	var out []Copy
	for _, sig := range order {
		f := merged[sig]
		if f.Language != "plpgsql" {
			out = append(out, Copy{Name: "sql " + sig, What: "branches"})
			continue
		}
		out = append(out, plpgsqlCopy(f))
	}
	return out
}

func plpgsqlCopy(f *Function) Copy {
	c := Copy{Name: "plpgsql " + f.Signature, What: "branches"}
	lines := strings.Split(f.Source, "\n")
	text := func(line int) string {
		if line >= 1 && line <= len(lines) {
			return strings.Join(strings.Fields(lines[line-1]), " ")
		}
		return ""
	}
	byID := map[int]*Statement{}
	children := map[int][]*Statement{}
	for i := range f.Statements {
		s := &f.Statements[i]
		byID[s.ID] = s
		children[s.Parent] = append(children[s.Parent], s)
	}
	listed := map[int]bool{} // statements named as a branch's first
	for i := range f.Statements {
		s := &f.Statements[i]
		c.Stmts++
		if s.Exec > 0 {
			c.StmtsReached++
		}
		kids := children[s.ID]
		// The bodies of s: each note's first statement.
		var notes []string
		first := map[string]*Statement{}
		for _, k := range kids {
			if _, ok := first[k.ParentNote]; !ok {
				notes = append(notes, k.ParentNote)
				first[k.ParentNote] = k
			}
		}
		branchy := strings.HasPrefix(s.Name, "IF") || strings.HasPrefix(s.Name, "CASE") ||
			strings.Contains(s.Name, "loop") || strings.Contains(s.Name, "LOOP") || strings.HasPrefix(s.Name, "FOR") ||
			strings.HasPrefix(s.Name, "WHILE") || strings.HasPrefix(s.Name, "FOREACH")
		// A statement that never ran is named once, below, not by each of
		// its branches.
		var taken int64
		for _, note := range notes {
			k := first[note]
			isBranch := branchy || strings.HasPrefix(note, "exception")
			if !isBranch {
				continue
			}
			c.Total++
			taken += k.Exec
			if k.Exec > 0 {
				c.Reached++
				continue
			}
			if s.Exec > 0 {
				listed[k.ID] = true
				c.Never = append(c.Never, fmt.Sprintf("line %d: %s (%s of %s at line %d)", k.Line, text(k.Line), note, s.Name, s.Line))
			}
		}
		implicit := ""
		switch {
		case strings.HasPrefix(s.Name, "IF") && !slices.Contains(notes, "else body"):
			implicit = "no condition holds, no ELSE"
		case strings.HasPrefix(s.Name, "CASE") && !slices.Contains(notes, "case else"):
			implicit = "no WHEN holds, no ELSE: CASE_NOT_FOUND"
		}
		if implicit != "" {
			c.Total++
			switch {
			case s.Exec > taken:
				c.Reached++
			case s.Exec > 0:
				c.Never = append(c.Never, fmt.Sprintf("line %d: %s (%s)", s.Line, text(s.Line), implicit))
			}
		}
	}
	// Statements never run inside a body that ran, not already named as
	// a branch: after a RETURN, an EXIT, a CONTINUE WHEN that held, or a
	// statement that raised.
	for i := range f.Statements {
		s := &f.Statements[i]
		if s.Exec > 0 || listed[s.ID] {
			continue
		}
		if p, ok := byID[s.Parent]; ok && p.Exec == 0 {
			continue
		}
		prev := (*Statement)(nil)
		for _, k := range children[s.Parent] {
			if k == s {
				break
			}
			if k.ParentNote == s.ParentNote {
				prev = k
			}
		}
		if prev != nil && prev.Exec == 0 {
			continue // the one before it is listed already
		}
		c.Never = append(c.Never, fmt.Sprintf("line %d: %s (%s never ran)", s.Line, text(s.Line), s.Name))
	}
	return c
}

// Cases reads the tallies a model test wrote (modeltest.EnvCover: lines
// "copy<TAB>case<TAB>count", or LuaFile's "file<TAB>branch<TAB>count") from r and adds them to into, by copy and
// case, keeping each copy's cases in their first order.
func Cases(r io.Reader, into *CaseTally) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 {
			return fmt.Errorf("tally line %q: want copy, case and count", sc.Text())
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return fmt.Errorf("tally line %q: %w", sc.Text(), err)
		}
		into.Add(f[0], f[1], n)
	}
	return sc.Err()
}

// CaseTally counts the steps that reached each case of each statement.
type CaseTally struct {
	order []string
	cases map[string][]string
	n     map[[2]string]int
}

// Add counts n steps more for case of copy.
func (t *CaseTally) Add(copy, c string, n int) {
	if t.cases == nil {
		t.cases, t.n = map[string][]string{}, map[[2]string]int{}
	}
	if _, ok := t.cases[copy]; !ok {
		t.order = append(t.order, copy)
	}
	if !slices.Contains(t.cases[copy], c) {
		t.cases[copy] = append(t.cases[copy], c)
	}
	t.n[[2]string{copy, c}] += n
}

// Copies returns a Copy per statement tallied, sorted by name.
func (t *CaseTally) Copies() []Copy { return t.copies("cases ", "cases") }

// Lua returns a Copy per Lua file tallied (LuaFile's lines: file, branch,
// count), "lua <file>", sorted by name.
func (t *CaseTally) Lua() []Copy { return t.copies("lua ", "branches") }

func (t *CaseTally) copies(prefix, what string) []Copy {
	var out []Copy
	for _, name := range t.order {
		c := Copy{Name: prefix + name, What: what}
		for _, k := range t.cases[name] {
			c.Total++
			if t.n[[2]string{name, k}] > 0 {
				c.Reached++
			} else {
				c.Never = append(c.Never, k)
			}
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Copy) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Count is how many steps reached case c of copy.
func (t *CaseTally) Count(copy, c string) int { return t.n[[2]string{copy, c}] }

// Go returns a Copy per Go file of the cover profiles read from
// profiles (go test -coverprofile; several runs' blocks merged), for the
// files of packages under module (an import path prefix) whose source is
// in root (the module's directory), sorted by file. A block never reached
// is named by its function and the text it begins with (a body by the
// line that opens it: "if x < 0 { (its body)", "case x: (its body)"):
// "func F: text", with
// " (#k)" when F has more than one block named so.
func Go(profiles []io.Reader, module, root string) ([]Copy, error) {
	type block struct {
		line, col int
	}
	files := map[string]map[block]bool{} // reached, by block
	for _, r := range profiles {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ln := sc.Text()
			if strings.HasPrefix(ln, "mode:") || ln == "" {
				continue
			}
			// file:l1.c1,l2.c2 stmts count
			colon := strings.LastIndex(ln, ":")
			fields := strings.Fields(ln[colon+1:])
			if colon < 0 || len(fields) != 3 {
				return nil, fmt.Errorf("cover profile line %q", ln)
			}
			start, _, _ := strings.Cut(fields[0], ",")
			l, c, _ := strings.Cut(start, ".")
			line, err1 := strconv.Atoi(l)
			col, err2 := strconv.Atoi(c)
			count, err3 := strconv.Atoi(fields[2])
			if err := cmp.Or(err1, err2, err3); err != nil {
				return nil, fmt.Errorf("cover profile line %q: %w", ln, err)
			}
			file := ln[:colon]
			if files[file] == nil {
				files[file] = map[block]bool{}
			}
			b := block{line, col}
			files[file][b] = files[file][b] || count > 0
		}
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	var names []string
	for f := range files {
		names = append(names, f)
	}
	slices.Sort(names)
	var out []Copy
	for _, name := range names {
		rel := strings.TrimPrefix(strings.TrimPrefix(name, module), "/")
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		lines := strings.Split(string(src), "\n")
		funcs, err := funcRanges(string(src))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rel, err)
		}
		var blocks []block
		for b := range files[name] {
			blocks = append(blocks, b)
		}
		slices.SortFunc(blocks, func(a, b block) int { return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.col, b.col)) })
		c := Copy{Name: "go " + rel, What: "blocks"}
		keys := make([]string, len(blocks))
		seen := map[string]int{}
		for i, b := range blocks {
			text := ""
			if b.line >= 1 && b.line <= len(lines) {
				l := lines[b.line-1]
				text = strings.Join(strings.Fields(l[min(len(l), b.col-1):]), " ")
				if text == "" || strings.HasPrefix(text, "{") {
					// A body: named by the line that opens it.
					text = strings.Join(strings.Fields(l), " ") + " (its body)"
				}
			}
			fn := "(no func)"
			for _, f := range funcs {
				if b.line >= f.from && b.line <= f.to {
					fn = f.name
				}
			}
			keys[i] = "func " + fn + ": " + text
			seen[keys[i]]++
		}
		at := map[string]int{}
		for i, b := range blocks {
			c.Total++
			at[keys[i]]++
			if files[name][b] {
				c.Reached++
				continue
			}
			k := keys[i]
			if seen[k] > 1 {
				k += fmt.Sprintf(" (#%d)", at[keys[i]])
			}
			c.Never = append(c.Never, k)
		}
		out = append(out, c)
	}
	return out, nil
}

type funcRange struct {
	name     string
	from, to int
}

// funcRanges returns the lines each function of src spans, methods as
// Type.Name.
func funcRanges(src string) ([]funcRange, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []funcRange
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok {
			continue
		}
		name := fd.Name.Name
		if fd.Recv != nil && len(fd.Recv.List) == 1 {
			t := fd.Recv.List[0].Type
			if s, ok := t.(*ast.StarExpr); ok {
				t = s.X
			}
			if ix, ok := t.(*ast.IndexExpr); ok {
				t = ix.X
			}
			if id, ok := t.(*ast.Ident); ok {
				name = id.Name + "." + name
			}
		}
		out = append(out, funcRange{name, fset.Position(fd.Pos()).Line, fset.Position(fd.End()).Line})
	}
	return out, nil
}

// Unreachable is the list of branches never reached by design: per copy,
// the branch (as the report names it; ending in "*", every branch that
// begins so) and why.
type Unreachable struct {
	Entries []Entry
}

// Entry is one line of the list: "copy | branch | why".
type Entry struct {
	Copy, Branch, Why string
	Line              int // in the list's file
}

// ParseUnreachable reads the list: a line "copy | branch | why" each,
// blank lines and lines starting with # left out.
func ParseUnreachable(r io.Reader) (*Unreachable, error) {
	u := &Unreachable{}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		ln := strings.TrimSpace(sc.Text())
		if ln == "" || strings.HasPrefix(ln, "#") {
			continue
		}
		f := strings.SplitN(ln, " | ", 3)
		if len(f) != 3 || strings.TrimSpace(f[2]) == "" {
			return nil, fmt.Errorf("line %d: want \"copy | branch | why\", got %q", n, ln)
		}
		u.Entries = append(u.Entries, Entry{Copy: strings.TrimSpace(f[0]), Branch: strings.TrimSpace(f[1]), Why: strings.TrimSpace(f[2]), Line: n})
	}
	return u, sc.Err()
}

// why returns the entry that lists branch of copy, if any: an entry's
// branch that ends in "*" lists every branch that begins as it does
// ("func F: *", every block of F never reached; "*", every branch of the
// copy).
func (u *Unreachable) why(copy, branch string) *Entry {
	for i := range u.Entries {
		e := &u.Entries[i]
		if e.Copy != copy {
			continue
		}
		if e.Branch == branch || strings.HasSuffix(e.Branch, "*") && strings.HasPrefix(branch, strings.TrimSuffix(e.Branch, "*")) {
			return e
		}
	}
	return nil
}

// Check holds copies to u: it returns the branches never reached that u
// does not list, and the entries of u that list a branch that was reached
// (or a copy the report does not have): each is a change to the list.
func (u *Unreachable) Check(copies []Copy) (unlisted, stale []string) {
	used := map[int]bool{}
	names := map[string]bool{}
	for _, c := range copies {
		names[c.Name] = true
		for _, b := range c.Never {
			if e := u.why(c.Name, b); e != nil {
				used[e.Line] = true
				continue
			}
			unlisted = append(unlisted, c.Name+" | "+b)
		}
	}
	for _, e := range u.Entries {
		switch {
		case !names[e.Copy]:
			stale = append(stale, fmt.Sprintf("line %d: %s: no such copy in the report", e.Line, e.Copy))
		case !used[e.Line]:
			stale = append(stale, fmt.Sprintf("line %d: %s | %s: reached", e.Line, e.Copy, e.Branch))
		}
	}
	return unlisted, stale
}

// Write prints the report: a line per copy (its share of branches
// reached, and of statements for a PL/pgSQL function), then each branch
// never reached, with why when u lists it.
func Write(w io.Writer, copies []Copy, u *Unreachable) {
	for _, c := range copies {
		switch {
		case strings.HasPrefix(c.Name, "sql "):
			fmt.Fprintf(w, "%-100s  no branches the profiler counts\n", c.Name)
		case c.Stmts > 0:
			fmt.Fprintf(w, "%-100s  %s %d/%d (%.0f%%), statements %d/%d\n", c.Name, c.What, c.Reached, c.Total, c.Share(), c.StmtsReached, c.Stmts)
		default:
			fmt.Fprintf(w, "%-100s  %s %d/%d (%.0f%%)\n", c.Name, c.What, c.Reached, c.Total, c.Share())
		}
		for _, b := range c.Never {
			why := "NOT LISTED as unreachable by design"
			if e := u.why(c.Name, b); e != nil {
				why = e.Why
			}
			fmt.Fprintf(w, "    never: %s\n        %s\n", b, why)
		}
	}
}
