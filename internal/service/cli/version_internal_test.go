package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestWriteVersion(t *testing.T) {
	t.Parallel()
	settings := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	const mod = "github.com/countlimit/countlimit"
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"go install @v0.1.0", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: mod, Version: "v0.1.0"},
			Settings: settings("GOOS", "linux", "GOARCH", "amd64")},
			"countlimit v0.1.0\n  module   " + mod + "\n  go       go1.26.8 linux/amd64\n"},
		{"a checkout with changes", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: mod, Version: "(devel)"},
			Settings: settings("vcs", "git", "vcs.revision", "cbf6a842b4590be122e11845ab6c6882f660d53a", "vcs.time", "2026-11-23T13:56:56Z", "vcs.modified", "true")},
			"countlimit (devel)\n  module   " + mod + "\n  revision cbf6a842b4590be122e11845ab6c6882f660d53a (2026-11-23T13:56:56Z), modified\n  go       go1.26.8\n"},
		{"a clean checkout", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: mod, Version: "v0.0.0-20261123135656-cbf6a842b459"},
			Settings: settings("vcs.revision", "cbf6a842b459", "vcs.modified", "false")},
			"countlimit v0.0.0-20261123135656-cbf6a842b459\n  module   " + mod + "\n  revision cbf6a842b459\n  go       go1.26.8\n"},
		{"a test binary", &debug.BuildInfo{GoVersion: "go1.26.8"}, "countlimit (devel)\n  go       go1.26.8\n"},
		{"no build information", nil, "countlimit (unknown version: built without module information)\n"},
	} {
		var b strings.Builder
		writeVersion(&b, tc.bi)
		if b.String() != tc.want {
			t.Errorf("%s: got\n%s\nwant\n%s", tc.name, b.String(), tc.want)
		}
	}
}
