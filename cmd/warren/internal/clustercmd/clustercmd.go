// Package clustercmd is `warren cluster`: status, add and remove, spoken to a node's cluster port.
package clustercmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"warren/server/cluster"
)

// Command returns the `cluster` command.
func Command() *cli.Command {
	server := &cli.StringFlag{Name: "server", Usage: "cluster `ADDRESS` (host:port of --cluster-listen) of any member", Required: true}
	timeout := &cli.DurationFlag{Name: "timeout", Value: 15 * time.Second, Usage: "give up after `DURATION`"}
	return &cli.Command{
		Name:  "cluster",
		Usage: "inspect and change cluster membership",
		Subcommands: []*cli.Command{
			{
				Name:  "status",
				Usage: "show the members and every Raft group with its leader",
				Flags: []cli.Flag{server, timeout, &cli.BoolFlag{Name: "json", Usage: "print JSON"}},
				Action: func(c *cli.Context) error {
					resp, err := admin(c, cluster.AdminRequest{Op: "status"})
					if err != nil {
						return err
					}
					if resp.Status == nil {
						return errors.New("the node sent no status")
					}
					if c.Bool("json") {
						enc := json.NewEncoder(c.App.Writer)
						enc.SetIndent("", "  ")
						return enc.Encode(resp.Status)
					}
					return printStatus(c.App.Writer, resp.Status)
				},
			},
			{
				Name:      "add",
				Usage:     "add a node (started with --cluster-join) to the cluster as a voting member",
				ArgsUsage: "ID=HOST:PORT",
				Flags:     []cli.Flag{server, timeout},
				Action: func(c *cli.Context) error {
					id, addr, ok := strings.Cut(c.Args().First(), "=")
					if c.NArg() != 1 || !ok || id == "" || addr == "" {
						return errors.New("usage: warren cluster add --server ADDRESS ID=HOST:PORT")
					}
					if _, err := admin(c, cluster.AdminRequest{Op: "add", ID: id, Addr: addr}); err != nil {
						return err
					}
					_, err := fmt.Fprintf(c.App.Writer, "added %s (%s)\n", id, addr)
					return err
				},
			},
			{
				Name:      "remove",
				Usage:     "remove a node from the cluster",
				ArgsUsage: "ID",
				Flags:     []cli.Flag{server, timeout},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return errors.New("usage: warren cluster remove --server ADDRESS ID")
					}
					if _, err := admin(c, cluster.AdminRequest{Op: "remove", ID: c.Args().First()}); err != nil {
						return err
					}
					_, err := fmt.Fprintf(c.App.Writer, "removed %s\n", c.Args().First())
					return err
				},
			},
		},
	}
}

func admin(c *cli.Context, req cluster.AdminRequest) (cluster.AdminResponse, error) {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	resp, err := cluster.Admin(ctx, c.String("server"), req)
	if err != nil {
		return resp, fmt.Errorf("cluster %s via %s: %w", req.Op, c.String("server"), err)
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("cluster %s: %s", req.Op, resp.Error)
	}
	return resp, nil
}

func printStatus(w io.Writer, st *cluster.Status) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "node %s (%s)\n\nMEMBER\tADDRESS\tVOTER\tUP\n", st.Node, st.Addr)
	for _, m := range st.Members {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%v\n", m.ID, m.Addr, m.Voter, m.Up)
	}
	fmt.Fprintf(tw, "\nGROUP\tLEADER\tVOTERS\tNONVOTERS\tAPPLIED\n")
	for _, g := range st.Groups {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", g.Name, g.Leader, strings.Join(g.Voters, ","), strings.Join(g.Nonvoters, ","), g.Applied)
	}
	return tw.Flush()
}
