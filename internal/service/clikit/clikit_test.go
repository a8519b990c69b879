package clikit

import "testing"

func TestPlural(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int
		want string
	}{{0, "0 rules"}, {1, "1 rule"}, {2, "2 rules"}} {
		if got := Plural(tc.n, "rule", "rules"); got != tc.want {
			t.Errorf("plural(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
