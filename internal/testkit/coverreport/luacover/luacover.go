// Package luacover makes a test build of a Lua script (Redis's Lua 5.1)
// that counts, as it runs, how often each of its branches ran: every body
// of an if (its then, each elseif, its else, and an else not written,
// which runs when no condition holds), every loop's body (while, for,
// repeat) starts with an HINCRBY of its own field in one hash. The test
// reads the hash back (internal/testkit/coverreport prints what it found).
//
// The build names a key outside the script's KEYS, which one Redis
// server allows and a Cluster refuses (a script there touches only keys
// of its slot): it is for a single server. Conditional expressions (a and
// b or c) are not branches here, as Go's cover profiles count none.
package luacover

import (
	"fmt"
	"slices"
	"strings"
)

// Build is a script's test build.
type Build struct {
	// Source is the script with a counter at the start of every branch,
	// each on the line of the keyword that opens the branch: the lines
	// are the script's.
	Source string
	// Branches names each branch, by the field its counter increments
	// (Field(file, i) for Branches[i]): "line 12: if x then (then)",
	// "line 14: else (else of the if at line 12)", "line 12: if x then
	// (no condition holds, no else)", "line 20: for i = 1, n do (loop
	// body)"; a name that two branches would share ends in " (#2)".
	Branches []string
}

// Field is the field of the hash that counts the i-th branch of file.
func Field(file string, i int) string { return fmt.Sprintf("%s#%d", file, i) }

// Instrument returns the test build of src, the Lua file named file,
// whose counters increment fields of the hash key (HINCRBY key field 1).
// It fails on a source whose blocks it cannot match.
func Instrument(file, src, key string) (Build, error) {
	toks, err := tokens(src)
	if err != nil {
		return Build{}, fmt.Errorf("%s: %w", file, err)
	}
	lines := strings.Split(src, "\n")
	text := func(line int) string {
		t := strings.Join(strings.Fields(lines[line-1]), " ")
		if len(t) > 80 {
			t = t[:77] + "..."
		}
		return t
	}
	type insert struct {
		at   int // byte offset in src
		text string
	}
	var (
		ins      []insert
		branches []string
		seen     = map[string]int{}
	)
	count := func(name string) string {
		seen[name]++
		if seen[name] > 1 {
			name += fmt.Sprintf(" (#%d)", seen[name])
		}
		i := len(branches)
		branches = append(branches, name)
		return fmt.Sprintf(" redis.call('HINCRBY', %s, %s, 1);", quote(key), quote(Field(file, i)))
	}
	type block struct {
		kind     string // if, loop, do, repeat, function
		line     int    // of its keyword
		head     int    // an if's: the line of the if or elseif whose then comes next
		awaitDo  bool   // a loop whose do is still to come
		hasElse  bool
		headKind string // "then" or "elseif"
	}
	var stack []*block
	top := func() *block {
		if len(stack) == 0 {
			return nil
		}
		return stack[len(stack)-1]
	}
	for _, t := range toks {
		b := top()
		switch t.text {
		case "function":
			stack = append(stack, &block{kind: "function", line: t.line})
		case "if":
			stack = append(stack, &block{kind: "if", line: t.line, head: t.line, headKind: "then"})
		case "elseif":
			if b == nil || b.kind != "if" {
				return Build{}, fmt.Errorf("%s:%d: elseif outside an if", file, t.line)
			}
			b.head, b.headKind = t.line, "elseif"
		case "then":
			if b == nil || b.kind != "if" {
				return Build{}, fmt.Errorf("%s:%d: then outside an if", file, t.line)
			}
			name := fmt.Sprintf("line %d: %s (%s)", b.head, text(b.head), b.headKind)
			ins = append(ins, insert{t.end, count(name)})
		case "else":
			if b == nil || b.kind != "if" {
				return Build{}, fmt.Errorf("%s:%d: else outside an if", file, t.line)
			}
			b.hasElse = true
			name := fmt.Sprintf("line %d: %s (else of the if at line %d)", t.line, text(t.line), b.line)
			ins = append(ins, insert{t.end, count(name)})
		case "while", "for":
			stack = append(stack, &block{kind: "loop", line: t.line, awaitDo: true})
		case "do":
			if b != nil && b.kind == "loop" && b.awaitDo {
				b.awaitDo = false
				name := fmt.Sprintf("line %d: %s (loop body)", b.line, text(b.line))
				ins = append(ins, insert{t.end, count(name)})
				break
			}
			stack = append(stack, &block{kind: "do", line: t.line})
		case "repeat":
			stack = append(stack, &block{kind: "repeat", line: t.line})
			name := fmt.Sprintf("line %d: %s (loop body)", t.line, text(t.line))
			ins = append(ins, insert{t.end, count(name)})
		case "until":
			if b == nil || b.kind != "repeat" {
				return Build{}, fmt.Errorf("%s:%d: until outside a repeat", file, t.line)
			}
			stack = stack[:len(stack)-1]
		case "end":
			if b == nil || b.kind == "repeat" || b.awaitDo {
				return Build{}, fmt.Errorf("%s:%d: an end that closes no block", file, t.line)
			}
			stack = stack[:len(stack)-1]
			if b.kind == "if" && !b.hasElse {
				name := fmt.Sprintf("line %d: %s (no condition holds, no else)", b.line, text(b.line))
				ins = append(ins, insert{t.start, " else" + count(name) + " "})
			}
		}
	}
	if len(stack) > 0 {
		return Build{}, fmt.Errorf("%s:%d: a %s never closed", file, top().line, top().kind)
	}
	slices.SortStableFunc(ins, func(a, b insert) int { return a.at - b.at })
	var out strings.Builder
	at := 0
	for _, in := range ins {
		out.WriteString(src[at:in.at])
		out.WriteString(in.text)
		at = in.at
	}
	out.WriteString(src[at:])
	return Build{Source: out.String(), Branches: branches}, nil
}

// quote returns s as a Lua string literal.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for _, c := range []byte(s) {
		switch {
		case c == '\'' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < ' ' || c > '~':
			fmt.Fprintf(&b, "\\%03d", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// token is a keyword of src: its text, where it starts and ends, and its
// line (from 1).
type token struct {
	text       string
	start, end int
	line       int
}

// keywords are the words that open, split or close a block.
var keywords = map[string]bool{
	"function": true, "if": true, "elseif": true, "then": true, "else": true, "end": true,
	"while": true, "for": true, "do": true, "repeat": true, "until": true,
}

// tokens returns the keywords of src that make its blocks, skipping
// comments, strings and every other token.
func tokens(src string) ([]token, error) {
	var out []token
	line := 1
	newlines := func(s string) { line += strings.Count(s, "\n") }
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == '-' && strings.HasPrefix(src[i:], "--"):
			if n := longBracket(src[i+2:]); n >= 0 {
				end, err := closeLong(src, i+2, n)
				if err != nil {
					return nil, fmt.Errorf("line %d: %w", line, err)
				}
				newlines(src[i:end])
				i = end
				continue
			}
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == '[' && longBracket(src[i:]) >= 0:
			end, err := closeLong(src, i, longBracket(src[i:]))
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			newlines(src[i:end])
			i = end
		case c == '\'' || c == '"':
			j := i + 1
			for ; j < len(src) && src[j] != c; j++ {
				if src[j] == '\\' {
					j++
				}
				if j < len(src) && src[j] == '\n' {
					line++
				}
			}
			if j >= len(src) {
				return nil, fmt.Errorf("line %d: a string never closed", line)
			}
			i = j + 1
		case isLetter(c):
			j := i
			for j < len(src) && (isLetter(src[j]) || isDigit(src[j])) {
				j++
			}
			if w := src[i:j]; keywords[w] && (i == 0 || (src[i-1] != '.' && src[i-1] != ':')) {
				out = append(out, token{w, i, j, line})
			}
			i = j
		case isDigit(c):
			j := i
			for j < len(src) && (isLetter(src[j]) || isDigit(src[j]) || src[j] == '.') {
				if (src[j] == 'e' || src[j] == 'E') && !strings.HasPrefix(src[i:], "0x") && j+1 < len(src) && (src[j+1] == '+' || src[j+1] == '-') {
					j++
				}
				j++
			}
			i = j
		default:
			i++
		}
	}
	return out, nil
}

// longBracket returns the level of the long bracket s opens with ([[,
// [=[, ...), or -1 when it opens none.
func longBracket(s string) int {
	if len(s) == 0 || s[0] != '[' {
		return -1
	}
	n := 1
	for n < len(s) && s[n] == '=' {
		n++
	}
	if n < len(s) && s[n] == '[' {
		return n - 1
	}
	return -1
}

// closeLong returns the offset past the close of the long bracket of
// level n that opens at src[at].
func closeLong(src string, at, n int) (int, error) {
	close := "]" + strings.Repeat("=", n) + "]"
	j := strings.Index(src[at+n+2:], close)
	if j < 0 {
		return 0, fmt.Errorf("a long bracket never closed")
	}
	return at + n + 2 + j + len(close), nil
}

func isLetter(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
