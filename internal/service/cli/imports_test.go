package cli_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The CLI is a transport over internal/service/ruleops, like the service: only
// serve.go, which starts the service, may import internal/service/server.
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
			if path != "github.com/countlimit/countlimit/internal/service/server" {
				continue
			}
			if name != "serve.go" {
				t.Errorf("%s imports internal/service/server: operations on named rules go through internal/service/ruleops", name)
			}
			serve = true
		}
	}
	if !serve {
		t.Error("serve.go no longer imports internal/service/server: update this test and the package doc")
	}
}
