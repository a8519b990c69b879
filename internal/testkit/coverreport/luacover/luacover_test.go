package luacover_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/testkit/coverreport/luacover"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

func TestMain(m *testing.M) { testbackend.Main(m) }

// src has a branch of every kind, and keywords where none opens a block:
// in comments, strings, long strings and after a dot.
const src = `-- if then else end: a comment
--[[ while x do end
]]
local s = 'if "then" end' .. "do \" end" .. [==[ repeat ]] until ]==]
local t = {['end'] = 1}
local function f(x)
  if x > 2 then return 'big' elseif x > 1 then return 'two' end
  if x == 1 then
    return 'one'
  else
    return 'small'
  end
end
local n = 0
for i = 1, tonumber(ARGV[1]) do n = n + 1 end
while n > 3 do n = n - 1 end
repeat n = n - 1 until n <= 0
do local z = 1e-3 end
return {f(tonumber(ARGV[1])), t['end']}
`

func TestInstrument(t *testing.T) {
	b, err := luacover.Instrument("t.lua", src, "cover")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`line 7: if x > 2 then return 'big' elseif x > 1 then return 'two' end (then)`,
		`line 7: if x > 2 then return 'big' elseif x > 1 then return 'two' end (elseif)`,
		`line 7: if x > 2 then return 'big' elseif x > 1 then return 'two' end (no condition holds, no else)`,
		`line 8: if x == 1 then (then)`,
		`line 10: else (else of the if at line 8)`,
		`line 15: for i = 1, tonumber(ARGV[1]) do n = n + 1 end (loop body)`,
		`line 16: while n > 3 do n = n - 1 end (loop body)`,
		`line 17: repeat n = n - 1 until n <= 0 (loop body)`,
	}
	if strings.Join(b.Branches, "\n") != strings.Join(want, "\n") {
		t.Errorf("branches:\n%s\nwant:\n%s", strings.Join(b.Branches, "\n"), strings.Join(want, "\n"))
	}
	if got, want := strings.Count(b.Source, "\n"), strings.Count(src, "\n"); got != want {
		t.Errorf("the build has %d lines, the source %d", got, want)
	}

	// Run on Redis (a database of the test's own), the build returns
	// what the source does and counts each branch as it runs.
	c := testbackend.Redis(t)
	ctx := context.Background()
	for _, arg := range []string{"3", "2", "1", "0", "5"} {
		got, err := c.Eval(ctx, b.Source, nil, arg).Result()
		if err != nil {
			t.Fatalf("the build, ARGV[1] = %s: %v\n%s", arg, err, b.Source)
		}
		plain, err := c.Eval(ctx, src, nil, arg).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, plain) {
			t.Errorf("ARGV[1] = %s: the build returned %v, the source %v", arg, got, plain)
		}
	}
	tally, err := c.HGetAll(ctx, "cover").Result()
	if err != nil {
		t.Fatal(err)
	}
	// x = 3, 2, 1, 0, 5: then twice, elseif once, neither twice; then of
	// the second if once (1), its else once (0); the loops every time.
	for i, want := range map[int]string{0: "2", 1: "1", 2: "2", 3: "1", 4: "1"} {
		if got := tally[luacover.Field("t.lua", i)]; got != want {
			t.Errorf("%s: ran %q times, want %q", b.Branches[i], got, want)
		}
	}
	for i := 5; i < 8; i++ {
		if tally[luacover.Field("t.lua", i)] == "" {
			t.Errorf("%s: never ran", b.Branches[i])
		}
	}
}
