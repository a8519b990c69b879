package countlimit_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNewcomerPath follows the README as a newcomer does: a new module
// beside a checkout of this repository, the README's install commands, and
// its quick start as main.go, run as it is; it must print what the README
// says it prints. The one step it stands in for is the git clone: the
// checkout under test is linked where the clone would be.
func TestNewcomerPath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module of its own")
	}
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	block := func(marker, lang string) string {
		t.Helper()
		_, after, ok := strings.Cut(readme, marker+"\n```"+lang+"\n")
		if !ok {
			t.Fatalf("README.md: no %s block after %s", lang, marker)
		}
		body, _, _ := strings.Cut(after, "```")
		return body
	}
	install, program := block("<!-- install-commands -->", "sh"), block("<!-- quick-start -->", "go")
	m := regexp.MustCompile("It prints ((?:`[^`]+`, )*`[^`]+`)").FindStringSubmatch(readme)
	if m == nil {
		t.Fatal("README.md: no \"It prints `...`\" after the quick start")
	}
	var want []string
	for _, q := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(m[1], -1) {
		want = append(want, q[1])
	}

	repo, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(repo, filepath.Join(dir, "countlimit")); err != nil {
		t.Fatal(err)
	}
	mod := filepath.Join(dir, "newcomer")
	if err := os.Mkdir(mod, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = mod
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("go", "mod", "init", "example.com/newcomer")
	for _, line := range strings.Split(strings.TrimSpace(install), "\n") {
		if strings.HasPrefix(line, "git clone ") {
			continue // the link above stands in for it
		}
		run("sh", "-c", line)
	}
	if err := os.WriteFile(filepath.Join(mod, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(run("go", "run", ".")), "\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the quick start printed %q; the README says %q", got, want)
	}
}
