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
// says it prints. Beside main.go it writes stores.go, which opens the
// PostgreSQL and Redis stores as the README does (and is never called), so
// that the install commands must also record what those stores import. The
// one step it stands in for is the git clone: the checkout under test is
// linked where the clone would be; and a comment line among the commands
// ("write your code ...") is where it writes the two files.
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
	written := false
	write := func() {
		t.Helper()
		for name, src := range map[string]string{"main.go": program, "stores.go": newcomerStores} {
			if err := os.WriteFile(filepath.Join(mod, name), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		written = true
	}
	run("go", "mod", "init", "example.com/newcomer")
	for _, line := range strings.Split(strings.TrimSpace(install), "\n") {
		switch {
		case strings.HasPrefix(line, "git clone "):
			continue // the link above stands in for it
		case strings.HasPrefix(line, "#") && !written:
			write()
			continue
		}
		run("sh", "-c", line)
	}
	if !written {
		write()
	}
	got := strings.Split(strings.TrimSpace(run("go", "run", ".")), "\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the quick start printed %q; the README says %q", got, want)
	}
}

// newcomerStores is a newcomer's second file: the README's PostgreSQL and
// Redis stores, which import pgx, goose and go-redis.
const newcomerStores = `package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

func stores(ctx context.Context) (pg, rd *countlimit.Limiter, err error) {
	pool, err := pgxpool.New(ctx, "postgres://...")
	if err != nil {
		return nil, nil, err
	}
	if err := pgstore.Migrate(ctx, pool); err != nil {
		return nil, nil, err
	}
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	return countlimit.New(pgstore.New(pool)), countlimit.New(redisstore.New(client)), nil
}
`
