// Package apirecord lists the exported API of a Go package as sorted lines
// of text, one per constant, variable, function, method, type, struct field
// and interface method, as the Go project's api/go1.*.txt files do, for a
// test that holds the public packages to the API recorded for a release
// (api/ at the module's root; docs/RELEASING.md).
//
// It reads the package's source (the files go/build selects for this
// platform, tests left out) and prints each declaration's types as they
// are written there, gofmt'd: a change of a signature, a field or a value
// shows as a changed line. It does not type-check, so a method promoted
// from an embedded type is not listed twice; apidiff, which CI runs
// against the last tag, judges compatibility.
package apirecord

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/printer"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
)

// Lines returns the exported API of the package in dir, whose import path
// is path, one line each, sorted: "pkg PATH, func New(s driver.Store,
// opts ...Option) *Limiter", "pkg PATH, method (*Limiter) Allow(...)",
// "pkg PATH, type Rule struct, Limit int64", "pkg PATH, const MaxIDLen = 512".
func Lines(dir, path string) ([]string, error) {
	bp, err := build.ImportDir(dir, 0)
	if err != nil {
		return nil, fmt.Errorf("apirecord: %s: %w", dir, err)
	}
	fset := token.NewFileSet()
	var out []string
	add := func(format string, args ...any) {
		out = append(out, "pkg "+path+", "+fmt.Sprintf(format, args...))
	}
	text := func(n ast.Node) string {
		var b bytes.Buffer
		if err := printer.Fprint(&b, fset, n); err != nil {
			return fmt.Sprintf("<%v>", err)
		}
		return strings.Join(strings.Fields(b.String()), " ")
	}
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("apirecord: %w", err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				sig := strings.TrimPrefix(text(d.Type), "func")
				if d.Recv == nil {
					add("func %s%s", d.Name.Name, sig)
					continue
				}
				recv := text(d.Recv.List[0].Type)
				if !ast.IsExported(strings.TrimLeft(strings.SplitN(recv, "[", 2)[0], "*")) {
					continue
				}
				add("method (%s) %s%s", recv, d.Name.Name, sig)
			case *ast.GenDecl:
				genDecl(d, add, text)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func genDecl(d *ast.GenDecl, add func(string, ...any), text func(ast.Node) string) {
	// A constant without a type or value repeats the last one's (iota).
	var lastType, lastValue ast.Expr
	for i, spec := range d.Specs {
		switch s := spec.(type) {
		case *ast.ValueSpec:
			if s.Type != nil || len(s.Values) > 0 {
				lastType, lastValue = s.Type, nil
				if len(s.Values) > 0 {
					lastValue = s.Values[0]
				}
			}
			for j, n := range s.Names {
				if !n.IsExported() {
					continue
				}
				kind := "var"
				if d.Tok == token.CONST {
					kind = "const"
				}
				line := kind + " " + n.Name
				if lastType != nil {
					line += " " + text(lastType)
				}
				if d.Tok == token.CONST {
					v := lastValue
					if j < len(s.Values) {
						v = s.Values[j]
					}
					if v != nil {
						line += " = " + text(v)
						if s.Values == nil {
							line += fmt.Sprintf(" (iota %d)", i)
						}
					}
				}
				add("%s", line)
			}
		case *ast.TypeSpec:
			if !s.Name.IsExported() {
				continue
			}
			name := s.Name.Name
			if s.TypeParams != nil {
				name += text(s.TypeParams)
			}
			switch t := s.Type.(type) {
			case *ast.StructType:
				add("type %s struct", name)
				for _, f := range t.Fields.List {
					if len(f.Names) == 0 { // embedded: promoted when its type's name is exported
						t := strings.TrimLeft(text(f.Type), "*")
						if ast.IsExported(t[strings.LastIndex(t, ".")+1:]) {
							add("type %s struct, embedded %s", name, text(f.Type))
						}
						continue
					}
					for _, fn := range f.Names {
						if fn.IsExported() {
							add("type %s struct, %s %s", name, fn.Name, text(f.Type))
						}
					}
				}
			case *ast.InterfaceType:
				add("type %s interface", name)
				for _, m := range t.Methods.List {
					if len(m.Names) == 0 {
						add("type %s interface, embedded %s", name, text(m.Type))
						continue
					}
					for _, mn := range m.Names {
						if mn.IsExported() {
							add("type %s interface, %s%s", name, mn.Name, strings.TrimPrefix(text(m.Type), "func"))
						}
					}
				}
			default:
				assign := " "
				if s.Assign.IsValid() {
					assign = " = "
				}
				add("type %s%s%s", name, assign, text(s.Type))
			}
		}
	}
}
