package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// Output is rabbitmqctl's: a header line of column names, then one tab-separated line per
// object (--no-table-headers drops the header), or with --formatter json one JSON array of
// objects holding the asked columns.

// field reads a dotted path (queue.name) from a decoded JSON object.
func field(obj map[string]any, path string) any {
	var cur any = obj
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

// cell renders a value as rabbitmqctl's table does: strings as they are, lists and maps as
// compact JSON, null as nothing.
func cell(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case json.Number:
		return v.String()
	case bool:
		if v {
			return "true"
		}
		return "false"
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(data)
}

// formatJSON reports whether the user asked for JSON.
func formatJSON(c *cli.Context) (bool, error) {
	switch f := c.String("formatter"); f {
	case "json":
		return true, nil
	case "", "table", "tsv":
		return false, nil
	default:
		return false, cli.Exit(fmt.Sprintf("--formatter %q: want table or json", f), ExitUsage)
	}
}

// printRows writes rows (each column name -> value) in the asked format.
func printRows(c *cli.Context, cols []string, rows []map[string]any) error {
	w := c.App.Writer
	asJSON, err := formatJSON(c)
	if err != nil {
		return err
	}
	if asJSON {
		out := make([]map[string]any, len(rows))
		for i, r := range rows {
			o := make(map[string]any, len(cols))
			for _, col := range cols {
				o[col] = r[col]
			}
			out[i] = o
		}
		return writeJSON(w, out)
	}
	var b strings.Builder
	if !c.Bool("no-table-headers") {
		b.WriteString(strings.Join(cols, "\t"))
		b.WriteByte('\n')
	}
	for _, r := range rows {
		for i, col := range cols {
			if i > 0 {
				b.WriteByte('\t')
			}
			b.WriteString(cell(r[col]))
		}
		b.WriteByte('\n')
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// printObject writes one object: "key<TAB>value" lines sorted by key, or JSON.
func printObject(c *cli.Context, obj map[string]any) error {
	asJSON, err := formatJSON(c)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(c.App.Writer, obj)
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s\t%s\n", k, cell(obj[k]))
	}
	_, err = io.WriteString(c.App.Writer, b.String())
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// done prints a one-line confirmation of a change unless --quiet (or JSON, which prints
// nothing for changes).
func done(c *cli.Context, format string, args ...any) error {
	if c.Bool("quiet") || c.String("formatter") == "json" {
		return nil
	}
	_, err := fmt.Fprintf(c.App.Writer, format+"\n", args...)
	return err
}
