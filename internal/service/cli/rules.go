package cli

import (
	"fmt"
	"io"

	"github.com/countlimit/countlimit/internal/service/clikit"
	"github.com/countlimit/countlimit/internal/service/rulefile"
)

func rules(args []string, stdout io.Writer) error {
	pos, err := parseMixed(clikit.NewFlagSet("rules"), args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return clikit.UsageErrorf("rules: want check FILE or default")
	}
	switch pos[0] {
	case "check":
		if len(pos) != 2 {
			return clikit.UsageErrorf("rules check: want one FILE")
		}
		f, err := rulefile.Load(pos[1])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: %s and %s: ok\n", pos[1], clikit.Plural(len(f.Rules), "rule", "rules"), clikit.Plural(len(f.Groups), "group", "groups"))
		return nil
	case "default":
		if len(pos) != 1 {
			return clikit.UsageErrorf("rules default: takes no arguments")
		}
		_, err := stdout.Write(rulefile.DefaultYAML())
		return err
	}
	return clikit.UsageErrorf("rules: want check FILE or default, got %q", pos[0])
}
