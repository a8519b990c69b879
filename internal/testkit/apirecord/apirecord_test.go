package apirecord_test

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/testkit/apirecord"
)

var update = flag.Bool("update", false, "write the API as it is now to api/next.txt")

const (
	root   = "../../.."
	module = "github.com/countlimit/countlimit"
)

// publicPackages lists the module's importable packages: every directory
// with Go files outside internal/ (Go forbids importing those) and cmd/
// (programs), and not package main.
func publicPackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && rel != "." {
			switch {
			case d.Name() == "internal", rel == "cmd", strings.HasPrefix(d.Name(), "."), d.Name() == "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !strings.Contains(string(src), "\npackage main\n") && !slices.Contains(dirs, filepath.Dir(rel)) {
				dirs = append(dirs, filepath.Dir(rel))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dirs)
	return dirs
}

// record returns the file the API must equal: api/next.txt while the next
// release's API differs from the last one's, else the last release's
// api/vX.Y.Z.txt.
func record(t *testing.T) string {
	t.Helper()
	next := filepath.Join(root, "api", "next.txt")
	if _, err := os.Stat(next); err == nil || *update {
		return next
	}
	files, _ := filepath.Glob(filepath.Join(root, "api", "v*.txt"))
	if len(files) == 0 {
		t.Fatalf("no API record: neither api/next.txt nor api/v*.txt (go test ./internal/testkit/apirecord -update writes next.txt)")
	}
	slices.SortFunc(files, func(a, b string) int { return slices.Compare(version(a), version(b)) })
	return files[len(files)-1]
}

// version returns the numbers of api/vX.Y.Z.txt.
func version(file string) []int {
	var v []int
	for _, f := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(file), "v"), ".txt"), ".") {
		n, _ := strconv.Atoi(f)
		v = append(v, n)
	}
	return v
}

// TestAPIIsRecorded holds the exported API of every public package to the
// record (see record and docs/RELEASING.md): a symbol added, removed or
// changed without the record updated fails, naming it. To update the
// record after a change that the CHANGELOG describes:
//
//	go test ./internal/testkit/apirecord -run TestAPIIsRecorded -update
func TestAPIIsRecorded(t *testing.T) {
	var now []string
	for _, dir := range publicPackages(t) {
		path := module
		if dir != "." {
			path += "/" + filepath.ToSlash(dir)
		}
		lines, err := apirecord.Lines(filepath.Join(root, dir), path)
		if err != nil {
			t.Fatal(err)
		}
		now = append(now, lines...)
	}
	slices.Sort(now)
	file := record(t)
	if *update {
		if err := os.WriteFile(file, []byte(strings.Join(now, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d lines", file, len(now))
		return
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	recorded := strings.Split(strings.TrimSpace(string(b)), "\n")
	var diff []string
	for _, l := range now {
		if !slices.Contains(recorded, l) {
			diff = append(diff, "+ "+l)
		}
	}
	for _, l := range recorded {
		if !slices.Contains(now, l) {
			diff = append(diff, "- "+l)
		}
	}
	if len(diff) > 0 {
		t.Errorf("the exported API differs from %s (+ in the code only, - in the record only):\n%s\n%s",
			filepath.Base(file), strings.Join(diff, "\n"),
			fmt.Sprintf("if the change is meant, say it in CHANGELOG.md and update the record: go test ./internal/testkit/apirecord -run TestAPIIsRecorded -update%s",
				map[bool]string{true: "", false: " (a released record is never edited: the update writes api/next.txt)"}[filepath.Base(file) == "next.txt"]))
	}
}

// TestReleasesAreRecorded: every released API record, api/vX.Y.Z.txt, has
// its release's commit in api/releases.txt, and every line there names a
// release with a record, so that a clone without tags still knows what
// each release was (CI's apidiff step compares with that commit).
func TestReleasesAreRecorded(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "api", "releases.txt"))
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]bool{}
	for n, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !isCommit(f[1]) {
			t.Errorf("api/releases.txt:%d: want VERSION COMMIT (40 hex digits), got %q", n+1, line)
			continue
		}
		if _, err := os.Stat(filepath.Join(root, "api", f[0]+".txt")); err != nil {
			t.Errorf("api/releases.txt:%d: %s has no API record api/%s.txt", n+1, f[0], f[0])
		}
		recorded[f[0]] = true
	}
	files, _ := filepath.Glob(filepath.Join(root, "api", "v*.txt"))
	for _, f := range files {
		if v := strings.TrimSuffix(filepath.Base(f), ".txt"); !recorded[v] {
			t.Errorf("api/%s.txt: the release %s has no commit in api/releases.txt (docs/RELEASING.md, step 7)", v, v)
		}
	}
}

// isCommit reports whether s is a full commit hash.
func isCommit(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}
