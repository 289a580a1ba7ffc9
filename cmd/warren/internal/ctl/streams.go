package ctl

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"

	"github.com/urfave/cli/v2"
)

// `warren ctl streams lag`: how far behind each reader of a stream is, from the HTTP API's
// stream endpoints (server/httpapi/streams.go). One row per
//   - stream consumer on the node answering (kind consumer: name is its tag, offset where it
//     reads, lag as the API computes it),
//   - stored (named) offset of a stream (kind offset: name is the reference),
//   - consumer group partition (kind group: name is the group, stream the (super) stream,
//     partition the partition stream, offset the group's committed offset there),
// with the stream's (or partition's) last offset and the lag. A group's committed offsets are
// named offsets of its partitions too: they show once, as the group's.

var lagColumns = []string{"stream", "kind", "name", "partition", "offset", "last_offset", "lag"}

func streamsCommand() *cli.Command {
	lag := &cli.Command{
		Name: "lag", Usage: "show the lag of stream consumers, stored offsets and consumer groups",
		ArgsUsage: "[-p VHOST] [STREAM ...] (default: every stream and super stream of the vhost)",
		Flags:     append([]cli.Flag{vhostFlag()}, commonFlags()...),
		Action:    streamsLag,
	}
	interspersed(lag)
	return &cli.Command{
		Name:        "streams",
		Usage:       "inspect streams (lag)",
		Subcommands: []*cli.Command{lag},
	}
}

func streamsLag(c *cli.Context) error {
	cl, err := newClient(c)
	if err != nil {
		return err
	}
	ctx, cancel := ctxOf(c)
	defer cancel()
	vhost := c.String("vhost")
	want := c.Args().Slice()

	var queues []map[string]any
	if err := cl.getJSON(ctx, "/api/queues/"+esc(vhost), &queues); err != nil {
		return err
	}
	last := map[string]any{} // stream -> its last offset (nil while empty)
	var streams []string
	for _, q := range queues {
		if q["type"] != "stream" {
			continue
		}
		name := fmt.Sprint(q["name"])
		last[name] = q["last_offset"]
		if q["messages"] != nil && cell(q["messages"]) == "0" {
			last[name] = nil
		}
		streams = append(streams, name)
	}
	var exchanges []map[string]any
	if err := cl.getJSON(ctx, "/api/exchanges/"+esc(vhost), &exchanges); err != nil {
		return err
	}
	var supers []string
	for _, x := range exchanges {
		if x["type"] == "x-super-stream" {
			supers = append(supers, fmt.Sprint(x["name"]))
		}
	}
	for _, w := range want {
		if _, ok := last[w]; !ok && !slices.Contains(supers, w) {
			return cli.Exit(fmt.Sprintf("streams lag: no stream or super stream %q in vhost %q", w, vhost), ExitSoftware)
		}
	}
	shown := func(name string) bool { return len(want) == 0 || slices.Contains(want, name) }

	var rows []map[string]any
	row := func(stream, kind, name, partition string, offset, lastOffset, lag any) {
		rows = append(rows, map[string]any{"stream": stream, "kind": kind, "name": name, "partition": partition,
			"offset": offset, "last_offset": lastOffset, "lag": lag})
	}

	// Consumer groups first: their committed offsets are the partitions' named offsets.
	groupOffsets := map[string]map[string]bool{} // partition -> group names
	for _, s := range append(append([]string{}, supers...), streams...) {
		groups, err := consumerGroups(ctx, cl, vhost, s)
		if err != nil {
			return err
		}
		for _, g := range groups {
			gname := fmt.Sprint(g["group"])
			parts, _ := g["partitions"].([]any)
			for _, p := range parts {
				pm, _ := p.(map[string]any)
				partition := fmt.Sprint(pm["partition"])
				if groupOffsets[partition] == nil {
					groupOffsets[partition] = map[string]bool{}
				}
				groupOffsets[partition][gname] = true
				if shown(s) || shown(partition) {
					row(s, "group", gname, partition, pm["committed_offset"], pm["last_offset"], pm["lag"])
				}
			}
		}
	}
	for _, s := range streams {
		if !shown(s) {
			continue
		}
		var tr struct {
			Offsets map[string]any `json:"offsets"`
		}
		if err := cl.getJSON(ctx, "/api/stream/"+esc(vhost)+"/"+esc(s)+"/tracking?type=offset", &tr); err != nil {
			return err
		}
		refs := make([]string, 0, len(tr.Offsets))
		for ref := range tr.Offsets {
			if !groupOffsets[s][ref] {
				refs = append(refs, ref)
			}
		}
		sort.Strings(refs)
		for _, ref := range refs {
			off := tr.Offsets[ref]
			row(s, "offset", ref, "", off, last[s], lagOf(off, last[s]))
		}
	}
	var consumers []map[string]any
	if err := cl.getJSON(ctx, "/api/stream/consumers/"+esc(vhost), &consumers); err != nil {
		return err
	}
	for _, cs := range consumers {
		s := fmt.Sprint(field(cs, "queue.name"))
		if !shown(s) {
			continue
		}
		row(s, "consumer", fmt.Sprint(cs["consumer_tag"]), "", cs["offset"], last[s], cs["offset_lag"])
	}
	sort.SliceStable(rows, func(i, j int) bool {
		for _, k := range []string{"stream", "kind", "name", "partition"} {
			a, b := cell(rows[i][k]), cell(rows[j][k])
			if a != b {
				return a < b
			}
		}
		return false
	})
	return printRows(c, lagColumns, rows)
}

// consumerGroups lists the groups of a stream or super stream (none when it has none).
func consumerGroups(ctx context.Context, cl *client, vhost, name string) ([]map[string]any, error) {
	var gs []map[string]any
	err := cl.getJSON(ctx, "/api/stream/consumer-groups/"+esc(vhost)+"/"+esc(name), &gs)
	if isNotFound(err) {
		return nil, nil
	}
	return gs, err
}

// lagOf is last - committed for a stored offset: the records after the one committed (0 when
// it is at the end or the stream is empty).
func lagOf(committed, last any) any {
	c, err1 := strconv.ParseUint(cell(committed), 10, 64)
	l, err2 := strconv.ParseUint(cell(last), 10, 64)
	if err1 != nil || err2 != nil || l <= c {
		return 0
	}
	return l - c
}
