// Package ctl is `warren ctl`: rabbitmqctl's, rabbitmq-queues' and rabbitmq-diagnostics'
// commands that operators script with, spoken to a running broker's HTTP API (RabbitMQ's
// management API paths), so the same command works against Warren and RabbitMQ.
//
// Output is rabbitmqctl's: lists print a header line and tab-separated rows (--formatter json
// for an array of objects); changes print one line (nothing with --quiet). Errors print the
// server's reason and exit with rabbitmqctl's codes: 64 bad usage, 65 refused input (400),
// 69 broker unreachable or health check failed, 70 other server errors (404...), 77 not
// authorised (401/403).
package ctl

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"warren/cmd/warren/internal/clustercmd"
	"warren/cmd/warren/internal/dlq"
)

// DefaultURL is the HTTP API `warren ctl` talks to without --url.
const DefaultURL = "http://127.0.0.1:15672"

// commonFlags are every ctl command's: where the broker is, who we are, how to print.
func commonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "url", Value: DefaultURL, EnvVars: []string{"WARREN_URL"},
			Usage: "`URL` of the broker's HTTP API (credentials may be in it: http://user:pass@host:15672)"},
		&cli.StringFlag{Name: "username", Aliases: []string{"u"}, Value: "guest", EnvVars: []string{"WARREN_USERNAME"}, Usage: "`USER` to log in as"},
		&cli.StringFlag{Name: "password", Value: "guest", EnvVars: []string{"WARREN_PASSWORD"}, Usage: "`PASSWORD` of --username"},
		&cli.StringFlag{Name: "formatter", Aliases: []string{"format", "f"}, Value: "table", Usage: "output `FORMAT`: table or json"},
		&cli.BoolFlag{Name: "no-table-headers", Aliases: []string{"s"}, Usage: "omit the header line of tables"},
		&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print nothing for successful changes"},
		&cli.DurationFlag{Name: "timeout", Aliases: []string{"t"}, Value: 60 * time.Second, Usage: "give up after `DURATION`"},
	}
}

func vhostFlag() cli.Flag {
	return &cli.StringFlag{Name: "vhost", Aliases: []string{"p"}, Value: "/", Usage: "`VHOST` to work in"}
}

// Command returns `warren ctl` and its subcommands.
func Command() *cli.Command {
	cmds := append(listCommands(), changeCommands()...)
	cmds = append(cmds, healthCommands()...)
	cmds = append(cmds, memberCommands()...)
	for _, c := range cmds {
		c.Flags = append(c.Flags, commonFlags()...)
		interspersed(c)
	}
	cmds = append(cmds, streamsCommand())
	// The cluster port's tools, under ctl as well as their old names.
	cmds = append(cmds, clustercmd.Command(), dlq.Command())
	return &cli.Command{
		Name:        "ctl",
		Usage:       "drive a running broker through its HTTP API, as rabbitmqctl (list_queues, add_user, set_policy, ...)",
		Description: "Commands and output are rabbitmqctl's. The broker is found with --url (WARREN_URL),\nlogged in to with --username/--password (WARREN_USERNAME, WARREN_PASSWORD).",
		Subcommands: cmds,
	}
}

// args checks the number of positional arguments.
func args(c *cli.Context, min, max int, usage string) ([]string, error) {
	n := c.NArg()
	if n < min || (max >= 0 && n > max) {
		return nil, cli.Exit(fmt.Sprintf("usage: warren ctl %s %s", c.Command.Name, usage), ExitUsage)
	}
	return c.Args().Slice(), nil
}

// --- changes ---------------------------------------------------------------------------------

func changeCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name: "add_user", Usage: "create a user", ArgsUsage: "USER PASSWORD",
			Flags: []cli.Flag{&cli.StringFlag{Name: "tags", Usage: "comma-separated `TAGS` (administrator, monitoring, ...)"}},
			Action: func(c *cli.Context) error {
				a, err := args(c, 2, 2, "USER PASSWORD")
				if err != nil {
					return err
				}
				return change(c, "PUT", "/api/users/"+esc(a[0]), map[string]any{"password": a[1], "tags": c.String("tags")},
					"Adding user %q ...", a[0])
			},
		},
		{
			Name: "delete_user", Usage: "delete a user", ArgsUsage: "USER",
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "USER")
				if err != nil {
					return err
				}
				return change(c, "DELETE", "/api/users/"+esc(a[0]), nil, "Deleting user %q ...", a[0])
			},
		},
		{
			Name: "change_password", Usage: "set a user's password", ArgsUsage: "USER PASSWORD",
			Action: func(c *cli.Context) error {
				a, err := args(c, 2, 2, "USER PASSWORD")
				if err != nil {
					return err
				}
				cl, err := newClient(c)
				if err != nil {
					return err
				}
				ctx, cancel := ctxOf(c)
				defer cancel()
				var u map[string]any
				if err := cl.getJSON(ctx, "/api/users/"+esc(a[0]), &u); err != nil {
					return err
				}
				if _, err := cl.do(ctx, "PUT", "/api/users/"+esc(a[0]), map[string]any{"password": a[1], "tags": u["tags"]}, nil); err != nil {
					return err
				}
				return done(c, "Changing password for user %q ...", a[0])
			},
		},
		{
			Name: "set_user_tags", Usage: "replace a user's tags", ArgsUsage: "USER [TAG ...]",
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, -1, "USER [TAG ...]")
				if err != nil {
					return err
				}
				cl, err := newClient(c)
				if err != nil {
					return err
				}
				ctx, cancel := ctxOf(c)
				defer cancel()
				// The user must exist (PUT would create one without a password).
				var u map[string]any
				if err := cl.getJSON(ctx, "/api/users/"+esc(a[0]), &u); err != nil {
					return err
				}
				if _, err := cl.do(ctx, "PUT", "/api/users/"+esc(a[0]), map[string]any{"tags": strings.Join(a[1:], ",")}, nil); err != nil {
					return err
				}
				return done(c, "Setting tags for user %q to [%s] ...", a[0], strings.Join(a[1:], ", "))
			},
		},
		{
			Name: "add_vhost", Usage: "create a virtual host", ArgsUsage: "VHOST",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "description", Usage: "`TEXT` describing the vhost"},
				&cli.StringFlag{Name: "tags", Usage: "comma-separated `TAGS`"},
				&cli.StringFlag{Name: "default-queue-type", Usage: "`TYPE` of queues declared without x-queue-type: classic, quorum or stream"},
			},
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "VHOST")
				if err != nil {
					return err
				}
				body := map[string]any{}
				for flag, key := range map[string]string{"description": "description", "tags": "tags", "default-queue-type": "default_queue_type"} {
					if c.IsSet(flag) {
						body[key] = c.String(flag)
					}
				}
				return change(c, "PUT", "/api/vhosts/"+esc(a[0]), body, "Adding vhost %q ...", a[0])
			},
		},
		{
			Name: "delete_vhost", Usage: "delete a virtual host and everything in it", ArgsUsage: "VHOST",
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "VHOST")
				if err != nil {
					return err
				}
				return change(c, "DELETE", "/api/vhosts/"+esc(a[0]), nil, "Deleting vhost %q ...", a[0])
			},
		},
		{
			Name: "set_permissions", Usage: "set a user's permissions in a vhost", ArgsUsage: "USER CONF WRITE READ",
			Flags: []cli.Flag{vhostFlag()},
			Action: func(c *cli.Context) error {
				a, err := args(c, 4, 4, "[-p VHOST] USER CONF WRITE READ")
				if err != nil {
					return err
				}
				vh := c.String("vhost")
				return change(c, "PUT", "/api/permissions/"+esc(vh)+"/"+esc(a[0]),
					map[string]any{"configure": a[1], "write": a[2], "read": a[3]},
					"Setting permissions for user %q in vhost %q ...", a[0], vh)
			},
		},
		vhostDelete("clear_permissions", "remove a user's permissions in a vhost", "USER", "permissions",
			"Clearing permissions for user %q in vhost %q ..."),
		{
			Name: "set_policy", Usage: "set a policy", ArgsUsage: "NAME PATTERN DEFINITION",
			Flags: []cli.Flag{vhostFlag(),
				&cli.IntFlag{Name: "priority", Usage: "`N`: the highest-priority matching policy applies"},
				&cli.StringFlag{Name: "apply-to", Value: "all", Usage: "`KIND` of objects: queues, classic_queues, quorum_queues, streams, exchanges or all"},
			},
			Action: func(c *cli.Context) error {
				return setPolicy(c, "policies")
			},
		},
		vhostDelete("clear_policy", "remove a policy", "NAME", "policies", "Clearing policy %q on vhost %q ..."),
		{
			Name: "set_operator_policy", Usage: "set an operator policy", ArgsUsage: "NAME PATTERN DEFINITION",
			Flags: []cli.Flag{vhostFlag(),
				&cli.IntFlag{Name: "priority", Usage: "`N`: the highest-priority matching policy applies"},
				&cli.StringFlag{Name: "apply-to", Value: "queues", Usage: "`KIND` of objects: queues, classic_queues, quorum_queues or streams"},
			},
			Action: func(c *cli.Context) error {
				return setPolicy(c, "operator-policies")
			},
		},
		vhostDelete("clear_operator_policy", "remove an operator policy", "NAME", "operator-policies",
			"Clearing operator policy %q on vhost %q ..."),
		{
			Name: "purge_queue", Usage: "remove a queue's ready messages", ArgsUsage: "QUEUE",
			Flags: []cli.Flag{vhostFlag()},
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "[-p VHOST] QUEUE")
				if err != nil {
					return err
				}
				vh := c.String("vhost")
				return change(c, "DELETE", "/api/queues/"+esc(vh)+"/"+esc(a[0])+"/contents", nil, "Purging queue %q in vhost %q ...", a[0], vh)
			},
		},
		{
			Name: "delete_queue", Usage: "delete a queue", ArgsUsage: "QUEUE",
			Flags: []cli.Flag{vhostFlag(),
				&cli.BoolFlag{Name: "if-empty", Aliases: []string{"e"}, Usage: "only if it has no messages"},
				&cli.BoolFlag{Name: "if-unused", Aliases: []string{"U"}, Usage: "only if it has no consumers"},
			},
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "[-p VHOST] [--if-empty] [--if-unused] QUEUE")
				if err != nil {
					return err
				}
				vh := c.String("vhost")
				q := []string{}
				if c.Bool("if-empty") {
					q = append(q, "if-empty=true")
				}
				if c.Bool("if-unused") {
					q = append(q, "if-unused=true")
				}
				path := "/api/queues/" + esc(vh) + "/" + esc(a[0])
				if len(q) > 0 {
					path += "?" + strings.Join(q, "&")
				}
				return change(c, "DELETE", path, nil, "Deleting queue %q on vhost %q ...", a[0], vh)
			},
		},
		{
			Name: "close_connection", Usage: "close a client connection (320 CONNECTION_FORCED with the reason)", ArgsUsage: "CONNECTION REASON",
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 2, "CONNECTION [REASON]")
				if err != nil {
					return err
				}
				hdr := http.Header{}
				if len(a) == 2 {
					hdr.Set("X-Reason", a[1])
				}
				cl, err := newClient(c)
				if err != nil {
					return err
				}
				ctx, cancel := ctxOf(c)
				defer cancel()
				if _, err := cl.do(ctx, "DELETE", "/api/connections/"+esc(a[0]), nil, hdr); err != nil {
					return err
				}
				return done(c, "Closing connection %q ...", a[0])
			},
		},
		{
			Name: "export_definitions", Usage: "write the broker's definitions (users, vhosts, queues, ...) to a file, or - for stdout", ArgsUsage: "FILE|-",
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "FILE|-")
				if err != nil {
					return err
				}
				cl, err := newClient(c)
				if err != nil {
					return err
				}
				ctx, cancel := ctxOf(c)
				defer cancel()
				data, err := cl.do(ctx, "GET", "/api/definitions", nil, nil)
				if err != nil {
					return err
				}
				if a[0] == "-" {
					_, err := c.App.Writer.Write(append(data, '\n'))
					return err
				}
				if err := os.WriteFile(a[0], data, 0o600); err != nil {
					return cli.Exit(fmt.Sprintf("export_definitions: %v", err), ExitSoftware)
				}
				return done(c, "Exported definitions to %q", a[0])
			},
		},
		{
			Name: "import_definitions", Usage: "import definitions from a file, or - for stdin", ArgsUsage: "FILE|-",
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "FILE|-")
				if err != nil {
					return err
				}
				var data []byte
				if a[0] == "-" {
					data, err = io.ReadAll(c.App.Reader)
				} else {
					data, err = os.ReadFile(a[0])
				}
				if err != nil {
					return cli.Exit(fmt.Sprintf("import_definitions: %v", err), ExitDataErr)
				}
				return change(c, "POST", "/api/definitions", data, "Imported definitions from %q", a[0])
			},
		},
	}
}

// change sends one change and prints its confirmation line.
// vhostDelete is a command that deletes one object of a vhost by name through the API
// (DELETE /api/{kind}/{vhost}/{name}), as rabbitmqctl's clear_* commands do.
func vhostDelete(name, usage, arg, kind, format string) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage, ArgsUsage: arg,
		Flags: []cli.Flag{vhostFlag()},
		Action: func(c *cli.Context) error {
			a, err := args(c, 1, 1, "[-p VHOST] "+arg)
			if err != nil {
				return err
			}
			vh := c.String("vhost")
			return change(c, "DELETE", "/api/"+kind+"/"+esc(vh)+"/"+esc(a[0]), nil, format, a[0], vh)
		},
	}
}

func change(c *cli.Context, method, path string, body any, format string, fa ...any) error {
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	if _, err := cl.do(ctx, method, path, body, nil); err != nil {
		return err
	}
	return done(c, format, fa...)
}

func setPolicy(c *cli.Context, kind string) error {
	a, err := args(c, 3, 3, "[-p VHOST] [--priority N] [--apply-to KIND] NAME PATTERN DEFINITION")
	if err != nil {
		return err
	}
	var def map[string]any
	if err := jsonUnmarshal(a[2], &def); err != nil {
		return cli.Exit(fmt.Sprintf("the definition %q is not a JSON object: %v", a[2], err), ExitUsage)
	}
	vh := c.String("vhost")
	body := map[string]any{"pattern": a[1], "definition": def, "priority": c.Int("priority"), "apply-to": c.String("apply-to")}
	what := "policy"
	if kind == "operator-policies" {
		what = "operator policy"
	}
	return change(c, "PUT", "/api/"+kind+"/"+esc(vh)+"/"+esc(a[0]), body,
		"Setting %s %q for pattern %q to %q with priority %q for vhost %q ...", what, a[0], a[1], a[2], strconv.Itoa(c.Int("priority")), vh)
}
