package cli

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/countlimit/countlimit/internal/service/clikit"
)

func version(args []string, stdout io.Writer) error {
	fs := clikit.NewFlagSet("version")
	if err := clikit.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return clikit.UsageErrorf("version: takes no arguments, got %q", fs.Arg(0))
	}
	bi, _ := debug.ReadBuildInfo() // nil when it has none
	writeVersion(stdout, bi)
	return nil
}

// writeVersion prints what bi (nil when the binary has none) says of the
// build: the module's version ("(devel)" for a build from a checkout rather
// than "go install ...@version"), the VCS revision with its time and
// whether the checkout had changes, and the Go version.
func writeVersion(w io.Writer, bi *debug.BuildInfo) {
	if bi == nil {
		fmt.Fprintln(w, "countlimit (unknown version: built without module information)")
		return
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	fmt.Fprintf(w, "countlimit %s\n", v)
	if bi.Main.Path != "" {
		fmt.Fprintf(w, "  module   %s\n", bi.Main.Path)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if rev := settings["vcs.revision"]; rev != "" {
		if t := settings["vcs.time"]; t != "" {
			rev += " (" + t + ")"
		}
		if settings["vcs.modified"] == "true" {
			rev += ", modified"
		}
		fmt.Fprintf(w, "  revision %s\n", rev)
	}
	goos, goarch := settings["GOOS"], settings["GOARCH"]
	platform := ""
	if goos != "" && goarch != "" {
		platform = " " + goos + "/" + goarch
	}
	fmt.Fprintf(w, "  go       %s%s\n", bi.GoVersion, platform)
}
