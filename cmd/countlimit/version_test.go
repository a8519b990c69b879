package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersion builds the command as a user would from a checkout and checks
// that "countlimit version" names a version and, where git can say which
// commit this is, the revision it was built from.
func TestVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "countlimit")
	build := []string{"build", "-o", bin}
	head, err := exec.Command("git", "-C", "../..", "rev-parse", "HEAD").Output()
	if err == nil {
		build = append(build, "-buildvcs=true") // whatever GOFLAGS says
	}
	if fi, err := os.Stat("../../.git"); err == nil && !fi.IsDir() {
		// A git worktree (or submodule), whose .git is a file: the go
		// command stamps a revision only beside a .git directory.
		t.Logf("../../.git is a file, not a directory: go build records no revision here")
		head = nil
	}
	if out, err := exec.Command("go", append(build, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(build, " "), err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("countlimit version: %v", err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if !strings.HasPrefix(first, "countlimit v") && first != "countlimit (devel)" {
		t.Errorf("countlimit version: first line %q, want a module version or (devel)", first)
	}
	if !strings.Contains(string(out), "\n  module   github.com/countlimit/countlimit\n") {
		t.Errorf("countlimit version does not name the module:\n%s", out)
	}
	if len(head) > 0 && !strings.Contains(string(out), "\n  revision "+strings.TrimSpace(string(head))) {
		t.Errorf("countlimit version does not name the revision %s:\n%s", head, out)
	}
}

// TestVersionFromTag: built from a checkout whose commit carries a release
// tag, "countlimit version" prints that version (Go stamps it from the tag).
func TestVersionFromTag(t *testing.T) {
	if _, err := exec.Command("git", "-C", "../..", "rev-parse", "HEAD").Output(); err != nil {
		t.Skip("not a git checkout: no tag to build from")
	}
	dir := filepath.Join(t.TempDir(), "src")
	for _, args := range [][]string{
		{"clone", "--quiet", "--no-hardlinks", "../..", dir},
		// A commit of its own, so that its tag is the only one on it
		// whatever the checkout's own tags are (v0.1.0 is a release).
		{"-C", dir, "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "--quiet", "--allow-empty", "-m", "test"},
		{"-C", dir, "-c", "user.name=test", "-c", "user.email=test@example.com", "tag", "-a", "v0.99.0", "-m", "v0.99.0"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	bin := filepath.Join(t.TempDir(), "countlimit")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/countlimit")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in the tagged clone: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("countlimit version: %v", err)
	}
	if first, _, _ := strings.Cut(string(out), "\n"); first != "countlimit v0.99.0" {
		t.Errorf("countlimit version built from tag v0.99.0: first line %q, want %q", first, "countlimit v0.99.0")
	}
}
