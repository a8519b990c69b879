package cli_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The CLI is a transport over internal/ruleops, like the service: only
// serve.go, which starts the service, may import internal/server.
func TestOnlyServeImportsServer(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var serve bool
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path != "github.com/countlimit/countlimit/internal/server" {
				continue
			}
			if name != "serve.go" {
				t.Errorf("%s imports internal/server: operations on named rules go through internal/ruleops", name)
			}
			serve = true
		}
	}
	if !serve {
		t.Error("serve.go no longer imports internal/server: update this test and the package doc")
	}
}
