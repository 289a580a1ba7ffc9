// Package dlq is `warren dlq`, tools for dead-letter queues. `warren dlq redrive` moves
// dead-lettered messages back to where they first died, or to a named queue, with publisher
// confirms: a message leaves the dead-letter queue only once its republish is confirmed, so a
// crash can duplicate a message but never lose one. It works against RabbitMQ as well as Warren.
//
// Republished messages keep every property and header, x-death and x-first-death-* included, so
// their history is not lost: on Warren and RabbitMQ 3.x a message that dies again continues that
// history (its x-death count grows). RabbitMQ 4.x no longer interprets x-death headers set by a
// publisher (rabbitmq-server #10709), so there a redriven message that dies again starts a new
// history. Only CC/BCC (set from the target) and the delivery headers x-delivery-count and
// x-acquired-count are not copied. The expiration a message had before it died (kept by the broker
// as original-expiration in x-death) is not restored, so a message that had expired does not
// expire again at once.
package dlq

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/urfave/cli/v2"
)

// DefaultURI is the broker `warren dlq` connects to when given no --uri.
const DefaultURI = "amqp://guest:guest@127.0.0.1:5672/"

// Command returns the `dlq` command and its `redrive` subcommand.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "dlq",
		Usage: "work with dead-letter queues",
		Subcommands: []*cli.Command{
			{
				Name:      "redrive",
				Usage:     "move dead-lettered messages back to where they came from, or to a queue",
				UsageText: "warren dlq redrive --uri URI --queue DLQ [--to QUEUE | --to-source-queue] [--limit N] [--dry-run]",
				Description: "Takes the messages of the dead-letter queue DLQ and republishes each to the exchange\n" +
					"and routing keys it had when it first died (x-first-death-exchange and the routing-keys\n" +
					"of that x-death entry; the first key as routing key, the others in the CC header).\n" +
					"Note that this reaches every queue those keys route to, not only the one the message\n" +
					"died in: --to-source-queue sends it to that one queue only, --to QUEUE to another queue.\n" +
					"\n" +
					"Publishes are mandatory and confirmed; a message leaves DLQ only once its republish is\n" +
					"confirmed (at-least-once: a crash can duplicate, never lose). A message the broker\n" +
					"returns as unroutable or refuses stays in DLQ and stops the redrive with an error; a\n" +
					"message without x-death (or whose exchange is gone) stays in DLQ and is counted as\n" +
					"failed. Messages keep all their properties and headers, x-death included. At most the\n" +
					"messages DLQ held at the start are taken, so messages dying again meanwhile are not.\n" +
					"\n" +
					"--dry-run takes the messages without acknowledging them, then returns them all to DLQ\n" +
					"(they come back marked redelivered) and prints what would be moved, grouped by reason\n" +
					"and source queue of their first death.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "uri", Value: DefaultURI, Usage: "AMQP `URI` of the broker"},
					&cli.StringFlag{Name: "queue", Required: true, Usage: "the dead-letter `QUEUE` to drain"},
					&cli.StringFlag{Name: "to", Usage: "send every message to `QUEUE` (through the default exchange) instead"},
					&cli.BoolFlag{Name: "to-source-queue", Usage: "send every message to the queue it first died in (through the default exchange) instead"},
					&cli.IntFlag{Name: "limit", Usage: "stop after `N` messages (0: all)"},
					&cli.BoolFlag{Name: "dry-run", Usage: "show what would be moved, remove nothing"},
					&cli.DurationFlag{Name: "confirm-timeout", Value: defaultConfirmTimeout, Usage: "how long to wait for a publisher confirm"},
				},
				Action: redriveAction,
			},
		},
	}
}

func redriveAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("redrive takes no arguments, got %q", c.Args().Slice())
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := Redrive(ctx, Options{
		URI:            c.String("uri"),
		Queue:          c.String("queue"),
		To:             c.String("to"),
		ToSourceQueue:  c.Bool("to-source-queue"),
		Limit:          c.Int("limit"),
		DryRun:         c.Bool("dry-run"),
		ConfirmTimeout: c.Duration("confirm-timeout"),
	})
	if res != nil {
		if werr := Report(c.App.Writer, res); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

// Report writes a Result for people: a table of the groups and a summary line.
func Report(w io.Writer, res *Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	if res.DryRun {
		fmt.Fprintf(w, "dry run on %q (%d ready): nothing is removed\n", res.Queue, res.Ready)
		if len(res.Groups) > 0 {
			fmt.Fprint(tw, "  MESSAGES\tREASON\tSOURCE QUEUE\tTARGET\n")
			for _, g := range res.Groups {
				fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", g.Count, dash(g.Reason), dash(g.SourceQueue), g.Target)
			}
		}
	} else if len(res.Groups) > 0 {
		fmt.Fprint(tw, "  MOVED\tFAILED\tREASON\tSOURCE QUEUE\tTARGET\n")
		for _, g := range res.Groups {
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%s\n", g.Moved, g.Failed, dash(g.Reason), dash(g.SourceQueue), g.Target)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var err error
	switch {
	case res.DryRun:
		if taken := res.Moved + res.Failed; res.Remaining >= 0 && res.Remaining < taken {
			fmt.Fprintf(w, "note: %q holds %d ready messages after the dry run took %d; the broker may still be returning them\n",
				res.Queue, res.Remaining, taken)
		}
		_, err = fmt.Fprintf(w, "dry run: would move %d, would fail %d\n", res.Moved, res.Failed)
	case res.InFlight > 0:
		_, err = fmt.Fprintf(w, "moved %d, failed %d (%d of them unconfirmed: they stay in %q and may also have been delivered)\n",
			res.Moved, res.Failed, res.InFlight, res.Queue)
	default:
		_, err = fmt.Fprintf(w, "moved %d, failed %d\n", res.Moved, res.Failed)
	}
	if err == nil && !res.DryRun && res.Remaining > 0 {
		_, err = fmt.Fprintf(w, "%d message(s) remain in %q\n", res.Remaining, res.Queue)
	}
	return err
}

// redactURI hides the password of an AMQP URI for error messages.
func redactURI(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "the broker"
	}
	return u.Redacted()
}
