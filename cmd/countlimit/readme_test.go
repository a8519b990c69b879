package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/service/rulefile"
)

// exchange is one "$ curl ..." line of a curl session and the output it
// shows.
type exchange struct {
	method, path, body string
	want               string
}

// curlSession reads the curl session that follows <!-- curl-session --> in
// the file named name (relative to the repository's root).
func curlSession(t *testing.T, name string) []exchange {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("../..", name))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "<!-- curl-session -->\n```console\n")
	if !ok {
		t.Fatalf("%s: no <!-- curl-session --> console block", name)
	}
	block, _, _ := strings.Cut(after, "```")
	cmdRE := regexp.MustCompile(`^\$ curl -s localhost:8080(\S+)(?: -d '([^']*)')?$`)
	var out []exchange
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		if strings.HasPrefix(line, "$ ") {
			m := cmdRE.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("%s: cannot replay %q", name, line)
			}
			ex := exchange{method: "GET", path: m[1], body: m[2]}
			if m[2] != "" {
				ex.method = "POST"
			}
			out = append(out, ex)
			continue
		}
		if len(out) == 0 {
			t.Fatalf("%s: output %q before any command", name, line)
		}
		out[len(out)-1].want += line
	}
	if len(out) < 3 {
		t.Fatalf("%s: only %d commands in the curl session", name, len(out))
	}
	return out
}

// normalize replaces what varies from run to run: instants, and waits
// other than 0 and -1.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			switch {
			case (k == "reset_at" || k == "blocked_until") && e != nil:
				if _, err := time.Parse(time.RFC3339Nano, e.(string)); err == nil {
					x[k] = "<instant>"
				}
			case k == "retry_after_seconds":
				if f, ok := e.(float64); ok && f > 0 {
					x[k] = "<wait>"
				}
			default:
				x[k] = normalize(e)
			}
		}
	case []any:
		for i := range x {
			x[i] = normalize(x[i])
		}
	}
	return v
}

// TestREADMESession builds the command and, for the curl session of the
// README and that of docs/service.md, each on a server of its own: starts
// "countlimit serve" as the file says (on a free port), replays the session
// against it, and stops it with SIGTERM.
func TestREADMESession(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("uses SIGTERM")
	}
	bin := filepath.Join(t.TempDir(), "countlimit")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, name := range []string{"README.md", "docs/service.md"} {
		t.Run(name, func(t *testing.T) { replay(t, bin, name) })
	}
}

// replay starts bin's server, replays the curl session of the file named
// name against it, and stops it.
func replay(t *testing.T, bin, name string) {
	session := curlSession(t, name)
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "COUNTLIMIT_STORE=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("serve printed nothing: %v", lines.Err())
	}
	m := regexp.MustCompile(`serving http://(\S+) \(store memory`).FindStringSubmatch(lines.Text())
	if m == nil {
		t.Fatalf("serve printed %q", lines.Text())
	}
	base := "http://" + m[1]

	for i, ex := range session {
		req, err := http.NewRequest(ex.method, base+ex.path, strings.NewReader(ex.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // what curl -d sends
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("command %d (%s %s): bad JSON %q", i+1, ex.method, ex.path, got)
		}
		if err := json.Unmarshal([]byte(ex.want), &w); err != nil {
			t.Fatalf("%s command %d: its output is not JSON: %q", name, i+1, ex.want)
		}
		if !reflect.DeepEqual(normalize(g), normalize(w)) {
			t.Errorf("command %d: %s %s %s\n got: %s\n%s: %s", i+1, ex.method, ex.path, ex.body, strings.TrimSpace(string(got)), name, ex.want)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	for lines.Scan() {
		fmt.Fprintln(&rest, lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve after SIGTERM: %v", err)
	}
	if !strings.Contains(rest.String(), "countlimit: stopped") {
		t.Errorf("serve after SIGTERM printed %q", rest.String())
	}
}

// TestServiceDocRuleFile checks that docs/service.md's rule-file example
// loads.
func TestServiceDocRuleFile(t *testing.T) {
	raw, err := os.ReadFile("../../docs/service.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "## Rule files\n\n```yaml\n")
	if !ok {
		t.Fatal("docs/service.md: no yaml block under ## Rule files")
	}
	block, _, _ := strings.Cut(after, "```")
	if _, err := rulefile.Parse("docs/service.md rule example", []byte(block)); err != nil {
		t.Error(err)
	}
}
