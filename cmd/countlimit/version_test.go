package main_test

import (
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
