package ctl

import (
	"fmt"
	"regexp"
	"sort"

	"github.com/urfave/cli/v2"
)

// Quorum queue membership, as rabbitmq-queues' add_member, delete_member, grow, shrink and
// rebalance, over the management API's replica endpoints (server/httpapi/members.go). grow,
// shrink and rebalance then print the quorum queues' members as they are, one row per queue
// (vhost, name, leader, members), the way rabbitmq-queues prints what it changed.

func memberCommands() []*cli.Command {
	return []*cli.Command{
		{
			Name: "add_member", Usage: "make a node a member of a quorum queue (rabbitmq-queues add_member)",
			ArgsUsage: "[-p VHOST] QUEUE NODE", Flags: []cli.Flag{vhostFlag()},
			Action: func(c *cli.Context) error {
				a, err := args(c, 2, 2, "[-p VHOST] QUEUE NODE")
				if err != nil {
					return err
				}
				return change(c, "POST", replicasPath(c, a[0])+"/add", map[string]any{"node": a[1]},
					"Adding a replica for queue %q on node %q ...", a[0], a[1])
			},
		},
		{
			Name: "delete_member", Usage: "remove a node from a quorum queue's members (rabbitmq-queues delete_member)",
			ArgsUsage: "[-p VHOST] QUEUE NODE", Flags: []cli.Flag{vhostFlag()},
			Action: func(c *cli.Context) error {
				a, err := args(c, 2, 2, "[-p VHOST] QUEUE NODE")
				if err != nil {
					return err
				}
				return change(c, "DELETE", replicasPath(c, a[0])+"/delete", map[string]any{"node": a[1]},
					"Removing the replica of queue %q on node %q ...", a[0], a[1])
			},
		},
		{
			Name: "grow", Usage: "add a node to the members of quorum queues (rabbitmq-queues grow)",
			ArgsUsage: "NODE all|even [--vhost-pattern RE] [--queue-pattern RE]",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "vhost-pattern", Value: ".*", Usage: "only queues in vhosts matching `REGEX`"},
				&cli.StringFlag{Name: "queue-pattern", Value: ".*", Usage: "only queues whose name matches `REGEX`"},
			},
			Action: func(c *cli.Context) error {
				a, err := args(c, 2, 2, "NODE all|even [--vhost-pattern RE] [--queue-pattern RE]")
				if err != nil {
					return err
				}
				if a[1] != "all" && a[1] != "even" {
					return cli.Exit(fmt.Sprintf("grow: the strategy is all or even, not %q", a[1]), ExitUsage)
				}
				for _, f := range []string{"vhost-pattern", "queue-pattern"} {
					if _, err := regexp.Compile(c.String(f)); err != nil {
						return cli.Exit(fmt.Sprintf("grow: --%s: %v", f, err), ExitUsage)
					}
				}
				body := map[string]any{"strategy": a[1], "vhost_pattern": c.String("vhost-pattern"), "queue_pattern": c.String("queue-pattern")}
				return changeThenMembers(c, "POST", "/api/queues/quorum/replicas/on/"+esc(a[0])+"/grow", body)
			},
		},
		{
			Name: "shrink", Usage: "remove a node from the members of every quorum queue (rabbitmq-queues shrink)",
			ArgsUsage: "NODE",
			Action: func(c *cli.Context) error {
				a, err := args(c, 1, 1, "NODE")
				if err != nil {
					return err
				}
				return changeThenMembers(c, "DELETE", "/api/queues/quorum/replicas/on/"+esc(a[0])+"/shrink", nil)
			},
		},
		{
			Name: "rebalance", Usage: "spread quorum queue leaders evenly over the nodes (rabbitmq-queues rebalance)",
			ArgsUsage: "[quorum|all]",
			Action: func(c *cli.Context) error {
				a, err := args(c, 0, 1, "[quorum|all]")
				if err != nil {
					return err
				}
				// Warren's only queues with leaders to move are quorum queues: all is quorum.
				if len(a) == 1 && a[0] != "quorum" && a[0] != "all" {
					return cli.Exit(fmt.Sprintf("rebalance: the queue type is quorum or all, not %q", a[0]), ExitUsage)
				}
				return changeThenMembers(c, "POST", "/api/rebalance/queues", nil)
			},
		},
	}
}

func replicasPath(c *cli.Context, queue string) string {
	return "/api/queues/quorum/" + esc(c.String("vhost")) + "/" + esc(queue) + "/replicas"
}

// changeThenMembers makes a membership change and prints every quorum queue's members after it.
func changeThenMembers(c *cli.Context, method, path string, body any) error {
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	if _, err := cl.do(ctx, method, path, body, nil); err != nil {
		return err
	}
	if c.Bool("quiet") {
		return nil
	}
	var qs []map[string]any
	if err := cl.getJSON(ctx, "/api/queues", &qs); err != nil {
		return err
	}
	cols := []string{"vhost", "name", "leader", "members"}
	var rows []map[string]any
	for _, q := range qs {
		if q["type"] != "quorum" {
			continue
		}
		rows = append(rows, map[string]any{"vhost": q["vhost"], "name": q["name"], "leader": q["leader"], "members": q["members"]})
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := fmt.Sprint(rows[i]["vhost"], "\x00", rows[i]["name"]), fmt.Sprint(rows[j]["vhost"], "\x00", rows[j]["name"])
		return a < b
	})
	return printRows(c, cols, rows)
}
