package redisstore

import (
	"regexp"
	"strings"
	"testing"
)

// TestCommonestSmoothCallMakesOneClosure holds fast.lua to the shape that
// keeps Redis's work for its commonest smooth call (one call that fits a
// key holding nothing or its string) below redis_rate's script's. Lua
// makes every function of a script anew on each run, 500-1 800
// instructions apiece, the more the more upvalues it takes
// (docs/benchmarks.md, "The commonest smooth call before any closure"), so
// before that call returns the script makes one function, instant, which
// names none of the chunk's locals: it has no upvalues.
func TestCommonestSmoothCallMakesOneClosure(t *testing.T) {
	t.Parallel()
	const ret = "if used then return {used, NONE, e, NONE, NONE, 1} end"
	at := strings.Index(builtScripts.fast.src, ret)
	if at < 0 {
		t.Fatalf("fast.lua returns no %q: this test needs to learn its new form", ret)
	}
	code := regexp.MustCompile(`--[^\n]*`).ReplaceAllString(builtScripts.fast.src[:at], "")
	fns := regexp.MustCompile(`\bfunction\b`).FindAllStringIndex(code, -1)
	if len(fns) != 1 {
		t.Fatalf("fast.lua makes %d functions before its commonest smooth call returns, want 1 (instant)", len(fns))
	}
	body := code[fns[0][0]:]
	end := strings.Index(body, "\nend\n")
	if end < 0 {
		t.Fatal("the function before fast.lua's commonest smooth call has no end at the line's start")
	}
	body = body[:end]
	for _, m := range regexp.MustCompile(`(?m)^local ([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)`).FindAllStringSubmatch(code, -1) {
		for name := range strings.SplitSeq(m[1], ",") {
			name = strings.TrimSpace(name)
			if name == "function" {
				continue
			}
			if regexp.MustCompile(`\b` + name + `\b`).MatchString(body) {
				t.Errorf("%s names the chunk's local %s: an upvalue, which Lua makes on every run", strings.SplitN(body, "\n", 2)[0], name)
			}
		}
	}
}
