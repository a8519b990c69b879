package server

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestJSONString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw, want, err string
	}{
		{`"abc"`, "abc", ""},
		{`null`, "", ""},
		{`""`, "", ""},
		{`"\ud83d\ude00"`, "😀", ""},
		{`"\uD83D\uDE00"`, "😀", ""},
		{`"😀"`, "😀", ""},
		{`"\ufffd"`, "\ufffd", ""},
		{`"x\\ud800"`, `x\ud800`, ""},
		{`"\\\ud83d\ude00"`, `\😀`, ""},
		{`"\u00e9\n\"\/"`, "é\n\"/", ""},
		{`"\ud800"`, "", `lone UTF-16 surrogate (\ud800)`},
		{`"\uDFFF"`, "", `lone UTF-16 surrogate (\uDFFF)`},
		{`"a\ude00b"`, "", `(\ude00)`},
		{`"\ud83d\u0041"`, "", `(\ud83d)`},
		{`"\ud83dx"`, "", `(\ud83d)`},
		{`"\ud83d"`, "", `(\ud83d)`},
		{`"\ud83d\ud83d\ude00"`, "", `(\ud83d)`},
		{`"\ud83d\ude00\ude00"`, "", `(\ude00)`},
		{`"\\\ud800"`, "", `(\ud800)`},
		{"\"a\xffb\"", "", "not valid UTF-8"},
		{"\"\xed\xa0\x80\"", "", "not valid UTF-8"}, // a surrogate encoded as UTF-8
		{`5`, "", "must be a string"},
		{`{"a": 1}`, "", "must be a string"},
	} {
		var got string
		err := jsonString(json.RawMessage(tc.raw), &got)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("jsonString(%s) = %q, %v; want %q", tc.raw, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("jsonString(%s) = %q, %v; want an error with %q", tc.raw, got, err, tc.err)
		}
	}
}

// FuzzJSONString checks that jsonString never loses information: a string
// it accepts decodes as encoding/json decodes it, with a U+FFFD only where
// the input spelled one out; and every valid string, encoded, is accepted.
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{`"a"`, `"\ud83d\ude00"`, `"\ud800"`, `"\\ud800"`, "\"\xff\"", `"\ufffd"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want string
		if json.Unmarshal(raw, &want) != nil || len(raw) == 0 || raw[0] != '"' {
			return // not a JSON string: the decoder refuses it before jsonString runs
		}
		var got string
		if err := jsonString(raw, &got); err == nil {
			if got != want {
				t.Fatalf("jsonString(%q) = %q, encoding/json says %q", raw, got, want)
			}
			if strings.ContainsRune(got, utf8.RuneError) && !strings.Contains(string(raw), "\ufffd") && !strings.Contains(strings.ToLower(string(raw)), `\ufffd`) {
				t.Fatalf("jsonString(%q) = %q: a U+FFFD the input did not hold", raw, got)
			}
		} else if !strings.ContainsRune(want, utf8.RuneError) {
			t.Fatalf("jsonString(%q) refused a string that decodes losslessly to %q: %v", raw, want, err)
		}
		if utf8.ValidString(want) {
			enc, _ := json.Marshal(want)
			var back string
			if err := jsonString(enc, &back); err != nil || back != want {
				t.Fatalf("jsonString(%s) = %q, %v; want %q back", enc, back, err, want)
			}
		}
	})
}
