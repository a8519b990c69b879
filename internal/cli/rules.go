package cli

import (
	"fmt"
	"io"

	"github.com/countlimit/countlimit/internal/rulefile"
)

func rules(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErrorf("rules: want check FILE or default")
	}
	switch args[0] {
	case "check":
		if len(args) != 2 {
			return usageErrorf("rules check: want one FILE")
		}
		f, err := rulefile.Load(args[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: %d rules, %d groups: ok\n", args[1], len(f.Rules), len(f.Groups))
		return nil
	case "default":
		if len(args) != 1 {
			return usageErrorf("rules default: takes no arguments")
		}
		_, err := stdout.Write(rulefile.DefaultYAML())
		return err
	}
	return usageErrorf("rules: want check FILE or default, got %q", args[0])
}
