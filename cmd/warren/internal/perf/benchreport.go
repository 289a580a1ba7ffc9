package perf

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// benchReport renders the results of a bench.
type benchReport struct {
	cfg         BenchConfig
	scenarios   []benchScenario
	results     map[string]map[string][]runOutcome // scenario id -> broker name -> runs
	warren, ref *benchTarget
	machine     machineInfo
	date        time.Time
	took        time.Duration
	interrupted bool
	loadStart   string // /proc/loadavg when the bench started
	loadEnd     string
	syncStart   string // describeSync when the bench started
	syncEnd     string
}

const ratioHeader = "Ratio (higher is better for Warren: Warren/RabbitMQ for rates, RabbitMQ/Warren for latency and memory)"

// cell is the table cell of one broker's median for metric m of scenario sc.
func (r *benchReport) cell(sc benchScenario, m benchMetric, t *benchTarget) (string, float64, bool) {
	if t == r.ref && r.ref.skip != "" {
		return "skipped", 0, false
	}
	outs := r.results[sc.id][t.name]
	v, n := median(outs, m.key)
	if n == 0 {
		if len(outs) == 0 {
			return "not run", 0, false
		}
		for _, o := range outs {
			if o.err != nil {
				return "failed", 0, false
			}
		}
		return "n/a", 0, false
	}
	s := fmtValue(m, v)
	if n < len(outs) {
		s += fmt.Sprintf(" (%d of %d runs)", n, len(outs))
	}
	return s, v, true
}

// rows returns the table rows: scenario, metric, Warren, RabbitMQ, ratio.
func (r *benchReport) rows() [][5]string {
	var rows [][5]string
	for _, sc := range r.scenarios {
		if sc.section != nil {
			continue
		}
		for i, m := range sc.metrics {
			name := ""
			if i == 0 {
				name = sc.id + " " + r.title(sc)
			}
			w, wv, wok := r.cell(sc, m, r.warren)
			f, fv, fok := r.cell(sc, m, r.ref)
			rat := "-"
			if wok && fok {
				if x, ok := ratio(m, wv, fv); ok {
					rat = fmt.Sprintf("%.2fx", x)
				}
			}
			rows = append(rows, [5]string{name, m.label, w, f, rat})
		}
	}
	return rows
}

// title is the scenario title with the bench's sizes filled in.
func (r *benchReport) title(sc benchScenario) string {
	switch sc.id {
	case "S6":
		return fmt.Sprintf("memory of %s idle connections", fmtInt(uint64(r.cfg.IdleConnections)))
	case "S7":
		return fmt.Sprintf("%s-message backlog (1 KB, persistent, confirms) filled then drained", fmtInt(uint64(r.cfg.Backlog)))
	case "S8":
		return fmt.Sprintf("stream: %s messages (1 KB) published with confirms, then consumed from first", fmtInt(uint64(r.cfg.StreamMessages)))
	case "S10":
		t := fmt.Sprintf("object counts: %s durable queues declared and bound, restart, memory", fmtInt(uint64(r.cfg.DeclareQueues)))
		if r.cfg.DeclareLargeQueues > r.cfg.DeclareQueues {
			t += fmt.Sprintf("; %s in a large run", fmtInt(uint64(r.cfg.DeclareLargeQueues)))
		}
		return t
	}
	return sc.title
}

// mainTable reports whether any scenario has rows in the S1-S9 table.
func (r *benchReport) mainTable() bool {
	for _, sc := range r.scenarios {
		if sc.section == nil {
			return true
		}
	}
	return false
}

// sections are the scenarios' own tables.
func (r *benchReport) sections() []reportSection {
	var out []reportSection
	for _, sc := range r.scenarios {
		if sc.section != nil {
			out = append(out, sc.section(r, sc))
		}
	}
	return out
}

// table is the plain-text result table for the terminal.
func (r *benchReport) table() string {
	header := [5]string{"Scenario", "Metric", "Warren", "RabbitMQ", "Ratio"}
	rows := r.rows()
	width := [5]int{}
	for _, row := range append([][5]string{header}, rows...) {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	if r.mainTable() {
		fmt.Fprintf(&b, "\nMedian of %d runs per broker. %s.\n\n", r.cfg.Runs, ratioHeader)
		line := func(row [5]string) {
			for i, c := range row {
				pad := width[i] - len([]rune(c))
				if i >= 2 {
					b.WriteString(strings.Repeat(" ", pad) + c)
				} else {
					b.WriteString(c + strings.Repeat(" ", pad))
				}
				if i < 4 {
					b.WriteString("  ")
				}
			}
			b.WriteString("\n")
		}
		line(header)
		for _, row := range rows {
			line(row)
		}
	}
	for _, sec := range r.sections() {
		fmt.Fprintf(&b, "\n%s\n%s\n\n", sec.title, sec.intro)
		b.WriteString(textTable(sec.header, sec.rows, sec.right))
	}
	if r.ref.skip != "" {
		fmt.Fprintf(&b, "\nRabbitMQ skipped: %s\n", r.ref.skip)
	}
	if notes := r.notes(); len(notes) > 0 {
		b.WriteString("\nNotes:\n")
		for _, n := range notes {
			b.WriteString("- " + n + "\n")
		}
	}
	return b.String()
}

// notes lists every run's errors and notes, prefixed by scenario, broker and run.
func (r *benchReport) notes() []string {
	var notes []string
	for _, sc := range r.scenarios {
		for _, t := range []*benchTarget{r.warren, r.ref} {
			for i, o := range r.results[sc.id][t.name] {
				prefix := fmt.Sprintf("%s %s run %d: ", sc.id, t.name, i+1)
				if o.err != nil {
					notes = append(notes, prefix+"FAILED: "+oneLine(o.err.Error()))
				}
				for _, n := range o.notes {
					notes = append(notes, prefix+oneLine(n))
				}
			}
		}
	}
	return notes
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// mdEscape makes s safe inside a Markdown table cell.
func mdEscape(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// markdown is docs/benchmarks.md.
func (r *benchReport) markdown() string {
	var b strings.Builder
	m := r.machine
	b.WriteString("# Benchmarks: Warren and RabbitMQ side by side\n\n")
	b.WriteString("Generated by `warren perf bench` (what `make bench` runs); rerun it to refresh this section (the sections after it are written by hand or by `warren perf stream`, and stay).\n\n")
	fmt.Fprintf(&b, "- Date: %s (the bench took %s)\n", r.date.Format("2006-01-02 15:04 MST"), r.took.Round(time.Second))
	fmt.Fprintf(&b, "- Command: `%s`\n", r.cfg.CommandLine)
	fmt.Fprintf(&b, "- Machine: %s, %d logical cores, %s RAM; %s; %s; open-files limit of the bench %s\n", m.CPU, m.Cores, m.RAM, m.Kernel, m.OS, m.FileLim)
	fmt.Fprintf(&b, "- Go: %s\n", m.GoVer)
	fmt.Fprintf(&b, "- Load average (1, 5, 15 min) when the bench started, i.e. other work on the machine: %s; when it ended, the bench included: %s\n", r.loadStart, r.loadEnd)
	fmt.Fprintf(&b, "- Disk: appending 64 KiB and fdatasyncing took %s when the bench started and %s when it ended (median of 25). Warren syncs before it confirms a persistent publish and RabbitMQ's streams do not, so the confirm-bound ratios (S11 above all) move with it.\n", r.syncStart, r.syncEnd)
	how := "at " + redact(r.warren.uri)
	if r.warren.proc != nil {
		how = "started by the bench (`serve` on a free loopback port), restarted with an empty data directory before every run"
	}
	fmt.Fprintf(&b, "- Warren: %s, %s\n", r.warren.version, how)
	if r.ref.skip != "" {
		fmt.Fprintf(&b, "- RabbitMQ: skipped (%s)\n", r.ref.skip)
	} else {
		fmt.Fprintf(&b, "- RabbitMQ: %s at %s, running throughout (not restarted)\n", r.ref.version, redact(r.ref.uri))
	}
	b.WriteString("- The load tool (`warren perf`, Go, github.com/rabbitmq/amqp091-go; S5 uses its own lean client instead; one connection per producer and per consumer) runs on the same machine and shares its cores with the broker under test.\n")
	if r.interrupted {
		b.WriteString("- **The bench was interrupted; some runs are missing.**\n")
	}
	if r.mainTable() {
		fmt.Fprintf(&b, "\nMedian of %d runs per broker; runs alternate Warren, RabbitMQ, Warren, ... Each throughput and latency run publishes for %s, then waits for the consumers to drain. %s.\n\n", r.cfg.Runs, r.cfg.Duration, ratioHeader)
		b.WriteString("| Scenario | Metric | Warren | RabbitMQ | Ratio |\n|---|---|---:|---:|---:|\n")
		for _, row := range r.rows() {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", mdEscape(row[0]), mdEscape(row[1]), mdEscape(row[2]), mdEscape(row[3]), mdEscape(row[4]))
		}
	}
	for _, sec := range r.sections() {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n", sec.title, sec.intro)
		b.WriteString(mdTable(sec.header, sec.rows, sec.right))
	}
	b.WriteString("\n## Scenarios\n\n")
	for _, sc := range r.scenarios {
		detail := sc.detail
		switch sc.id {
		case "S6":
			detail = fmt.Sprintf("Connections: %s. ", fmtInt(uint64(r.cfg.IdleConnections))) + detail
		case "S7":
			detail = fmt.Sprintf("Backlog: %s messages; fill and drain are each bounded by %s. ", fmtInt(uint64(r.cfg.Backlog)), r.cfg.BacklogTimeout) + detail
		case "S8":
			detail = fmt.Sprintf("Messages: %s; publishing and consuming are each bounded by %s. ", fmtInt(uint64(r.cfg.StreamMessages)), r.cfg.BacklogTimeout) + detail
		case "S10":
			large := "no large run"
			if r.cfg.DeclareLargeQueues > r.cfg.DeclareQueues {
				large = "large run: " + fmtInt(uint64(r.cfg.DeclareLargeQueues))
			}
			detail = fmt.Sprintf("Queues: %s (%s); %d channels on %d connection(s); each declare phase is bounded by %s. ",
				fmtInt(uint64(r.cfg.DeclareQueues)), large, r.cfg.DeclareChannels, r.cfg.DeclareConnections, r.cfg.DeclareTimeout) + detail
		}
		fmt.Fprintf(&b, "- **%s %s.** %s\n", sc.id, r.title(sc), detail)
	}
	if r.mainTable() {
		b.WriteString("\nEvery message body carries the producer id, a sequence number and the send time; for runs with publisher confirms the tool checks that every confirmed message was consumed (`lost` below would say otherwise).\n")
	}
	if notes := r.notes(); len(notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	b.WriteString("\n## CPU use\n\nCPU seconds per wall-clock second over each whole run (setup and drain included), median over runs: ")
	fmt.Fprintf(&b, "the load tool and the broker share the machine's %d cores, so when their sum is near %d the machine, not the broker alone, sets the pace.\n\n", m.Cores, m.Cores)
	b.WriteString("| Scenario | Broker under test | Load tool (cores) | Broker (cores) |\n|---|---|---:|---:|\n")
	for _, sc := range r.scenarios {
		for _, t := range []*benchTarget{r.warren, r.ref} {
			outs := r.results[sc.id][t.name]
			if len(outs) == 0 {
				continue
			}
			tool, broker := cpuMedians(outs)
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", sc.id, t.name, tool, broker)
		}
	}
	b.WriteString("\n## All runs\n\n| Scenario | Metric | Broker | Runs |\n|---|---|---|---|\n")
	for _, sc := range r.scenarios {
		for _, mt := range sc.metrics {
			for _, t := range []*benchTarget{r.warren, r.ref} {
				outs := r.results[sc.id][t.name]
				if len(outs) == 0 {
					continue
				}
				vals := make([]string, len(outs))
				for i, o := range outs {
					v, ok := o.values[mt.key]
					switch {
					case o.err != nil:
						vals[i] = "failed"
					case !ok:
						vals[i] = "n/a"
					default:
						vals[i] = fmtValue(mt, v)
					}
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", sc.id, mdEscape(mt.label), t.name, strings.Join(vals, ", "))
			}
		}
	}
	return b.String()
}

// cpuMedians formats the median tool and broker CPU use of runs.
func cpuMedians(outs []runOutcome) (tool, broker string) {
	var ts, bs []float64
	for _, o := range outs {
		ts = append(ts, o.toolCores)
		if o.brokerCores >= 0 {
			bs = append(bs, o.brokerCores)
		}
	}
	f := func(vs []float64) string {
		if len(vs) == 0 {
			return "n/a"
		}
		sort.Float64s(vs)
		n := len(vs)
		if n%2 == 1 {
			return fmt.Sprintf("%.2f", vs[n/2])
		}
		return fmt.Sprintf("%.2f", (vs[n/2-1]+vs[n/2])/2)
	}
	return f(ts), f(bs)
}
