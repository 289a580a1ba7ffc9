package ctl

import (
	"flag"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// rabbitmqctl takes options anywhere on the line (list_queues name messages --formatter json),
// while urfave/cli stops reading flags at the first argument. So ctl's commands skip cli's
// flag parsing and parse here, flags first, whatever their place.

// interspersed makes cmd accept its flags anywhere among its arguments.
func interspersed(cmd *cli.Command) {
	action := cmd.Action
	cmd.SkipFlagParsing = true
	cmd.Action = func(c *cli.Context) error {
		for _, a := range c.Args().Slice() {
			if a == "-h" || a == "--help" {
				return help(c, cmd)
			}
			if a == "--" {
				break
			}
		}
		nc, err := reparse(c, cmd)
		if err != nil {
			return err
		}
		return action(nc)
	}
}

// reparse parses c's arguments with cmd's flags wherever they stand.
func reparse(c *cli.Context, cmd *cli.Command) (*cli.Context, error) {
	set := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	set.SetOutput(discard{})
	takesValue := map[string]bool{}
	for _, f := range cmd.Flags {
		if err := f.Apply(set); err != nil {
			return nil, cli.Exit(fmt.Sprintf("%s: %v", cmd.Name, err), ExitUsage)
		}
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			takesValue[n] = !isBool
		}
	}
	var flags, pos []string
	in := c.Args().Slice()
	for i := 0; i < len(in); i++ {
		a := in[i]
		if a == "--" {
			pos = append(pos, in[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		tv, known := takesValue[name]
		if !known {
			return nil, cli.Exit(fmt.Sprintf("warren ctl %s: unknown option %s (see warren ctl %s --help)", cmd.Name, a, cmd.Name), ExitUsage)
		}
		flags = append(flags, a)
		if tv && !hasValue {
			if i+1 >= len(in) {
				return nil, cli.Exit(fmt.Sprintf("warren ctl %s: option %s needs a value", cmd.Name, a), ExitUsage)
			}
			i++
			flags = append(flags, in[i])
		}
	}
	if err := set.Parse(append(append(flags, "--"), pos...)); err != nil {
		return nil, cli.Exit(fmt.Sprintf("warren ctl %s: %v", cmd.Name, err), ExitUsage)
	}
	// Each name of a flag is its own variable in a flag.FlagSet: give every name the value
	// set through any of them (urfave/cli does the same after its own parse).
	visited := map[string]string{}
	set.Visit(func(f *flag.Flag) { visited[f.Name] = f.Value.String() })
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			if v, ok := visited[n]; ok {
				for _, m := range f.Names() {
					_ = set.Set(m, v)
				}
			}
		}
	}
	nc := cli.NewContext(c.App, set, c)
	nc.Command = c.Command
	return nc, nil
}

// help prints a command's usage and options.
func help(c *cli.Context, cmd *cli.Command) error {
	var b strings.Builder
	name := "warren ctl " + cmd.Name
	if strings.HasPrefix(cmd.HelpName, "warren ctl ") {
		name = cmd.HelpName // a subcommand's full name (warren ctl streams lag)
	}
	fmt.Fprintf(&b, "%s - %s\n\nUSAGE:\n   %s [options] %s\n\nOPTIONS:\n", name, cmd.Usage, name, cmd.ArgsUsage)
	for _, f := range cmd.Flags {
		fmt.Fprintf(&b, "   %s\n", f)
	}
	_, err := fmt.Fprint(c.App.Writer, b.String())
	return err
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
