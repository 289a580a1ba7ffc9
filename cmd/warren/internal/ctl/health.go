package ctl

import (
	"github.com/urfave/cli/v2"
)

// healthCommands are rabbitmq-diagnostics' checks, on the management API's health endpoints:
// each prints the check's answer and exits 0 when it passes, 69 with the server's reason when
// it fails (503), as load balancers' and Kubernetes' probes expect.
func healthCommands() []*cli.Command {
	check := func(name, usage, argsUsage string, nargs int, path func(a []string) string) *cli.Command {
		return &cli.Command{
			Name: name, Usage: usage, ArgsUsage: argsUsage,
			Action: func(c *cli.Context) error {
				a, err := args(c, nargs, nargs, argsUsage)
				if err != nil {
					return err
				}
				cl, err := newClient(c)
				if err != nil {
					return err
				}
				ctx, cancel := ctxOf(c)
				defer cancel()
				var ans map[string]any
				if err := cl.getJSON(ctx, path(a), &ans); err != nil {
					return err
				}
				if asJSON, _ := formatJSON(c); asJSON {
					return writeJSON(c.App.Writer, ans)
				}
				if st, ok := ans["status"]; ok {
					return done(c, "%s passed: %s", name, cell(st))
				}
				return done(c, "%s passed", name)
			},
		}
	}
	return []*cli.Command{
		check("ping", "check that the broker answers on its HTTP API", "", 0, func([]string) string { return "/api/overview" }),
		check("check_alarms", "fail if a resource alarm is in effect anywhere in the cluster", "", 0,
			func([]string) string { return "/api/health/checks/alarms" }),
		check("check_local_alarms", "fail if a resource alarm is in effect on this node", "", 0,
			func([]string) string { return "/api/health/checks/local-alarms" }),
		check("check_virtual_hosts", "fail if a virtual host is not running", "", 0,
			func([]string) string { return "/api/health/checks/virtual-hosts" }),
		check("check_port_listener", "fail if nothing listens on PORT", "PORT", 1,
			func(a []string) string { return "/api/health/checks/port-listener/" + esc(a[0]) }),
		check("check_protocol_listener", "fail if no listener serves PROTOCOL (amqp, amqps, http, stream, ...)", "PROTOCOL", 1,
			func(a []string) string { return "/api/health/checks/protocol-listener/" + esc(a[0]) }),
		check("check_if_node_is_quorum_critical", "fail if stopping this node would leave a quorum queue without a majority", "", 0,
			func([]string) string { return "/api/health/checks/node-is-quorum-critical" }),
		check("check_certificate_expiration", "fail if a listener's certificate expires within N UNITs (days, weeks, months, years)", "N UNIT", 2,
			func(a []string) string {
				return "/api/health/checks/certificate-expiration/" + esc(a[0]) + "/" + esc(a[1])
			}),
		check("aliveness_test", "declare, publish to and get from a test queue in VHOST", "VHOST", 1,
			func(a []string) string { return "/api/aliveness-test/" + esc(a[0]) }),
	}
}
