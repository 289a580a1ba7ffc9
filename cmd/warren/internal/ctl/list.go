package ctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// list is one list_* command: where its objects are and which columns rabbitmqctl shows.
type list struct {
	name, usage string
	// path is the API path; vhost is the -p value (ignored when the list is not per vhost).
	path     func(c *cli.Context) (string, error)
	perVhost bool
	defaults []string
	// columns maps rabbitmqctl's column names onto the API's objects where they differ: a
	// dotted path or a function; other names are the API's own field names.
	columns map[string]any
}

func (l list) command() *cli.Command {
	cmd := &cli.Command{
		Name:      l.name,
		Usage:     l.usage,
		ArgsUsage: "[COLUMN ...] (default: " + strings.Join(l.defaults, " ") + ")",
		Action:    l.run,
	}
	if l.perVhost {
		cmd.Flags = append(cmd.Flags, vhostFlag())
	}
	return cmd
}

func (l list) run(c *cli.Context) error {
	cols := c.Args().Slice()
	if len(cols) == 0 {
		cols = l.defaults
	}
	path, err := l.path(c)
	if err != nil {
		return err
	}
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	var objs []map[string]any
	if err := cl.getJSON(ctx, path, &objs); err != nil {
		return err
	}
	// Refuse unknown columns as rabbitmqctl does, once we can see the objects' fields.
	if len(objs) > 0 {
		for _, col := range cols {
			if _, ok := l.columns[col]; ok {
				continue
			}
			if _, ok := objs[0][col]; !ok && !strings.Contains(col, ".") {
				return cli.Exit(fmt.Sprintf("%s: unknown column %q; known: %s", l.name, col, strings.Join(known(objs[0], l.columns), ", ")), ExitUsage)
			}
		}
	}
	rows := make([]map[string]any, len(objs))
	for i, o := range objs {
		r := make(map[string]any, len(cols))
		for _, col := range cols {
			switch m := l.columns[col].(type) {
			case string:
				r[col] = field(o, m)
			case func(map[string]any) any:
				r[col] = m(o)
			default:
				r[col] = field(o, col)
			}
		}
		rows[i] = r
	}
	return printRows(c, cols, rows)
}

func known(obj map[string]any, aliases map[string]any) []string {
	var out []string
	for k := range obj {
		out = append(out, k)
	}
	for k := range aliases {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// vhostPath is a per-vhost list's path: /api/KIND/{vhost}.
func vhostPath(kind string) func(c *cli.Context) (string, error) {
	return func(c *cli.Context) (string, error) { return "/api/" + kind + "/" + esc(c.String("vhost")), nil }
}

func fixed(path string) func(c *cli.Context) (string, error) {
	return func(*cli.Context) (string, error) { return path, nil }
}

// tagList renders a user's tags as rabbitmqctl does: [administrator, monitoring].
func tagList(o map[string]any) any {
	var tags []string
	switch t := o["tags"].(type) {
	case []any:
		for _, x := range t {
			tags = append(tags, fmt.Sprint(x))
		}
	case string:
		if t != "" {
			tags = strings.Split(t, ",")
		}
	}
	return "[" + strings.Join(tags, ", ") + "]"
}

func listCommands() []*cli.Command {
	lists := []list{
		{name: "list_queues", usage: "list queues and their messages", perVhost: true, path: vhostPath("queues"),
			defaults: []string{"name", "messages"}},
		{name: "list_exchanges", usage: "list exchanges", perVhost: true, path: vhostPath("exchanges"),
			defaults: []string{"name", "type"}},
		{name: "list_bindings", usage: "list bindings", perVhost: true, path: vhostPath("bindings"),
			defaults: []string{"source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"},
			columns: map[string]any{"source_name": "source", "source_kind": func(map[string]any) any { return "exchange" },
				"destination_name": "destination", "destination_kind": "destination_type"}},
		{name: "list_connections", usage: "list client connections", path: fixed("/api/connections"),
			defaults: []string{"user", "peer_host", "peer_port", "state"}},
		{name: "list_channels", usage: "list channels", path: fixed("/api/channels"),
			defaults: []string{"pid", "user", "consumer_count", "messages_unacknowledged"},
			columns:  map[string]any{"pid": "name"}},
		{name: "list_consumers", usage: "list consumers", perVhost: true, path: vhostPath("consumers"),
			defaults: []string{"queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments"},
			columns:  map[string]any{"queue_name": "queue.name", "channel_pid": "channel_details.name"}},
		{name: "list_users", usage: "list users and their tags", path: fixed("/api/users"),
			defaults: []string{"user", "tags"},
			columns:  map[string]any{"user": "name", "tags": tagList}},
		{name: "list_vhosts", usage: "list virtual hosts", path: fixed("/api/vhosts"),
			defaults: []string{"name"}},
		{name: "list_permissions", usage: "list users' permissions in a vhost", perVhost: true,
			path: func(c *cli.Context) (string, error) {
				return "/api/vhosts/" + esc(c.String("vhost")) + "/permissions", nil
			},
			defaults: []string{"user", "configure", "write", "read"}},
		{name: "list_user_permissions", usage: "list a user's permissions in every vhost",
			path: func(c *cli.Context) (string, error) {
				if c.NArg() != 1 {
					return "", cli.Exit("usage: warren ctl list_user_permissions USER", ExitUsage)
				}
				return "/api/users/" + esc(c.Args().First()) + "/permissions", nil
			},
			defaults: []string{"vhost", "configure", "write", "read"}},
		{name: "list_policies", usage: "list policies", perVhost: true, path: vhostPath("policies"),
			defaults: []string{"vhost", "name", "pattern", "apply-to", "definition", "priority"}},
		{name: "list_operator_policies", usage: "list operator policies", perVhost: true, path: vhostPath("operator-policies"),
			defaults: []string{"vhost", "name", "pattern", "apply-to", "definition", "priority"}},
	}
	var cmds []*cli.Command
	for _, l := range lists {
		cmd := l.command()
		if l.name == "list_user_permissions" {
			// Its one argument is the user, not a column.
			cmd.ArgsUsage = "USER"
			l := l
			cmd.Action = func(c *cli.Context) error {
				path, err := l.path(c)
				if err != nil {
					return err
				}
				return list{name: l.name, path: fixed(path), defaults: l.defaults}.runCols(c, l.defaults)
			}
		}
		cmds = append(cmds, cmd)
	}
	cmds = append(cmds, &cli.Command{
		Name: "status", Usage: "show the node: version, object and message totals",
		Action: func(c *cli.Context) error {
			cl, err := newClient(c)
			if err != nil {
				return err
			}
			ctx, cancel := ctxOf(c)
			defer cancel()
			var ov map[string]any
			if err := cl.getJSON(ctx, "/api/overview", &ov); err != nil {
				return err
			}
			if asJSON, _ := formatJSON(c); asJSON {
				return writeJSON(c.App.Writer, ov)
			}
			return printObject(c, flatten(ov))
		},
	}, &cli.Command{
		Name: "cluster_status", Usage: "list the cluster's nodes and whether they run",
		Action: list{name: "cluster_status", path: fixed("/api/nodes"), defaults: []string{"name", "type", "running"}}.run,
	})
	return cmds
}

// runCols runs the list with fixed columns (no positional columns).
func (l list) runCols(c *cli.Context, cols []string) error {
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	path, _ := l.path(c)
	ctx, cancel := ctxOf(c)
	defer cancel()
	var objs []map[string]any
	if err := cl.getJSON(ctx, path, &objs); err != nil {
		return err
	}
	rows := make([]map[string]any, len(objs))
	for i, o := range objs {
		r := map[string]any{}
		for _, col := range cols {
			r[col] = field(o, col)
		}
		rows[i] = r
	}
	return printRows(c, cols, rows)
}

// flatten turns {"a": {"b": 1}} into {"a.b": 1}, one level deep, for status's key/value lines.
func flatten(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			for k2, v2 := range sub {
				out[k+"."+k2] = v2
			}
			continue
		}
		out[k] = v
	}
	return out
}

// jsonUnmarshal decodes s keeping numbers as written.
func jsonUnmarshal(s string, out any) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	return dec.Decode(out)
}
