package countlimit_test

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippetPrelude declares what the README's Go snippets use without
// declaring it: the caller's ids, a pool, an SMS gateway, a test's t.
// Imports a snippet does not use are soft errors, ignored below; a
// variable a snippet declares and never uses is not, as for the compiler.
const snippetPrelude = `package snippet

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/httplimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/pgstore/pgstoretest"
	"github.com/countlimit/countlimit/countlimit/promlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/redisstore/redisstoretest"
)

var (
	ctx           = context.Background()
	userID, phone string
	ip            string
	code          string
	batch         []string
	gateway       interface{ Send(phone, code string) error }
	pinRule       countlimit.Rule
	pool          *pgxpool.Pool
	limiter       *countlimit.Limiter
	mux           *http.ServeMux
	t             *testing.T
)

func snippet() error {
`

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestReadmeSnippetsCompile type-checks every Go block of the README and of
// docs/*.md: a whole program (a block that starts with "package") as it
// is, any other as the body of a function, so a snippet that would not
// compile when pasted (a method that does not exist, a wrong argument)
// fails here.
func TestReadmeSnippetsCompile(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	exports := exportData(t)
	for _, name := range append([]string{"README.md"}, docs...) {
		checkSnippets(t, exports, name)
	}
}

func checkSnippets(t *testing.T, exports map[string]string, name string) {
	t.Helper()
	readme, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlock.FindAllSubmatch(readme, -1)
	if name == "README.md" && len(blocks) < 4 {
		t.Fatalf("found %d Go blocks in README.md, want the quick start, PostgreSQL, Redis and failure ones at least", len(blocks))
	}
	for i, b := range blocks {
		body := string(b[1])
		if strings.HasPrefix(body, "package ") {
			checkProgram(t, exports, fmt.Sprintf("%s Go block %d", name, i+1), body)
			continue
		}
		// A leading import block names packages the prelude imports.
		if strings.HasPrefix(body, "import (") {
			end := strings.Index(body, "\n)\n")
			for _, line := range strings.Split(body[:end], "\n")[1:] {
				if p := strings.TrimSpace(line); p != "" && !strings.Contains(snippetPrelude, p) {
					t.Errorf("%s block %d imports %s, which the test's prelude lacks: add it there", name, i+1, p)
				}
			}
			body = body[end+3:]
		}
		src := snippetPrelude + body + "\n\treturn nil\n}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "snippet.go", src, 0)
		if err != nil {
			t.Errorf("%s Go block %d does not parse: %v\n%s", name, i+1, err, body)
			continue
		}
		var hard []string
		conf := types.Config{
			Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
				file, ok := exports[path]
				if !ok {
					return nil, fmt.Errorf("no export data for %s", path)
				}
				return os.Open(file)
			}),
			Error: func(err error) {
				if te, ok := err.(types.Error); ok && te.Soft && strings.Contains(te.Msg, "imported") && strings.HasSuffix(te.Msg, "not used") {
					return // the prelude imports what any snippet may use
				}
				hard = append(hard, err.Error())
			},
		}
		_, _ = conf.Check("snippet", fset, []*ast.File{f}, nil)
		if len(hard) > 0 {
			t.Errorf("%s Go block %d does not compile:\n  %s\n%s", name, i+1, strings.Join(hard, "\n  "), body)
		}
	}
}

// checkProgram type-checks src, a whole file, as the compiler would: every
// error counts, unused imports and variables too.
func checkProgram(t *testing.T, exports map[string]string, what, src string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "main.go", src, 0)
	if err != nil {
		t.Errorf("%s does not parse: %v\n%s", what, err, src)
		return
	}
	var errs []string
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			file, ok := exports[path]
			if !ok {
				return nil, fmt.Errorf("no export data for %s (add it to the snippet prelude's imports)", path)
			}
			return os.Open(file)
		}),
		Error: func(err error) { errs = append(errs, err.Error()) },
	}
	_, _ = conf.Check("main", fset, []*ast.File{f}, nil)
	if len(errs) > 0 {
		t.Errorf("%s does not compile:\n  %s\n%s", what, strings.Join(errs, "\n  "), src)
	}
}

// exportData compiles the prelude's imports and their dependencies and
// returns where each package's export data is, by import path.
func exportData(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "prelude.go", snippetPrelude+"return nil\n}\n", parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"list", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}"}
	for _, imp := range f.Imports {
		args = append(args, strings.Trim(imp.Path.Value, `"`))
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(line, "="); ok && file != "" {
			m[path] = file
		}
	}
	return m
}
