package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// S10 measures what many objects cost: declaring them, restarting with them, holding them.
const (
	s10Pattern       = "perf-bench-s10-%d"
	s10LargePattern  = "perf-bench-s10-large-%d"
	declareWindow    = 1000             // pairs over which S10's first and last rates are taken
	restartLimit     = 2 * time.Minute  // bound on a restart until the last queue answers
	refCleanupLimit  = 10 * time.Minute // bound on deleting S10's queues from the reference broker
	s10LargePrefix   = "large_"
	s10TargetTotal   = 15.0 // seconds for 10,000 pairs
	s10TargetRestart = 5.0  // seconds to restart with 10,000 queues
	s10TargetRSS     = 15.0 // KB per idle queue
	s10TargetKeep    = 0.75 // the rate over the last window over the rate over the first
	s10TargetAt      = 10000
	s10TargetLarge   = 100000
)

// S10's metric keys (the large run's carry s10LargePrefix).
const (
	s10FirstRate     = "first_rate"
	s10LastRate      = "last_rate"
	s10Declared      = "declared"
	s10Total         = "total_s"
	s10CPUFirst      = "cpu_first_ms"
	s10CPULast       = "cpu_last_ms"
	s10RestartAccept = "restart_accept_s"
	s10RestartReady  = "restart_ready_s"
	s10Present       = "present"
	s10RSS           = "rss_kb"
	s10RSSRestart    = "rss_restart_kb"
)

const (
	pairsUnit   = "pairs/s"
	secondsUnit = "s"
	cpuUnit     = "ms CPU"
	countUnit   = "count"
)

// declareScenario is S10.
func declareScenario() benchScenario {
	m := func(key, label, unit string, lower bool) benchMetric {
		return benchMetric{key: key, label: label, unit: unit, lowerBetter: lower}
	}
	metrics := []benchMetric{
		m(s10FirstRate, "declare rate, first 1,000 (pairs/s)", pairsUnit, false),
		m(s10LastRate, "declare rate, last 1,000 (pairs/s)", pairsUnit, false),
		m(s10Declared, "pairs declared", countUnit, false),
		m(s10Total, "time to declare all (s)", secondsUnit, true),
		m(s10CPUFirst, "broker CPU per pair, first 1,000 (ms)", cpuUnit, true),
		m(s10CPULast, "broker CPU per pair, last 1,000 (ms)", cpuUnit, true),
		m(s10RestartAccept, "restart: port accepts (s)", secondsUnit, true),
		m(s10RestartReady, "restart: last queue answers a passive declare (s)", secondsUnit, true),
		m(s10Present, "queues present after restart", countUnit, false),
		m(s10RSS, "idle RSS per queue after declaring (KB)", "KB", true),
		m(s10RSSRestart, "idle RSS per queue after restart (KB)", "KB", true),
	}
	base := append([]benchMetric(nil), metrics...)
	for _, x := range base {
		if x.key == s10CPUFirst || x.key == s10CPULast || x.key == s10RSSRestart {
			continue
		}
		x.key = s10LargePrefix + x.key
		x.label = "large run: " + x.label
		metrics = append(metrics, x)
	}
	return benchScenario{
		id: "S10", title: "object counts: durable queues declared and bound, restart, memory",
		detail: "The channels declare durable classic queues in parallel, each bound to amq.direct with its name as routing key; " +
			"a pair is done when queue.declare-ok and queue.bind-ok are in. Rates are pairs per second over the first and the last 1,000 pairs in the order they completed; " +
			"broker CPU per pair is read from /proc/PID/stat at the window edges. Memory: the broker's VmRSS once settled, " +
			"with the queues and idle, minus that of the fresh broker, divided by the queues. Warren is then stopped with SIGTERM and started on the same data directory: " +
			"the times are from its start until the AMQP port accepts and until a passive queue.declare of the queue declared last succeeds; every queue is then checked " +
			"by a passive declare, and the bindings of 11 of them by a message through amq.direct. RabbitMQ (shared, never restarted) is measured for declares and memory only, " +
			"and the queues declared in it are deleted afterwards. The large run (Warren only, once per bench, on a fresh broker) shows that many queues can be declared.",
		metrics: metrics,
		bound: func(c BenchConfig) time.Duration {
			bound := c.DeclareTimeout + 2*restartLimit + refCleanupLimit + 5*time.Minute
			if c.DeclareLargeQueues > c.DeclareQueues {
				bound += c.DeclareTimeout + restartLimit + 5*time.Minute
			}
			return bound
		},
		run:     runDeclareScenario,
		section: declareSection,
	}
}

// runDeclareScenario is S10.
func runDeclareScenario(ctx context.Context, b *bencher, t *benchTarget) runOutcome {
	out := runOutcome{values: map[string]float64{}}
	if b.cfg.DeclareQueues < 1 {
		out.err = errors.New("--declare-queues must be at least 1")
		return out
	}
	ok, err := measureObjects(ctx, b, t, b.cfg.DeclareQueues, s10Pattern, "", &out)
	if err != nil {
		out.err = err
		return out
	}
	if t.proc == nil || t.largeDone || b.cfg.DeclareLargeQueues <= b.cfg.DeclareQueues || ctx.Err() != nil {
		return out
	}
	t.largeDone = true
	if !ok {
		out.notes = append(out.notes, fmt.Sprintf("large run of %s queues not made: the %s did not all declare and check",
			fmtInt(uint64(b.cfg.DeclareLargeQueues)), fmtInt(uint64(b.cfg.DeclareQueues))))
		return out
	}
	t.proc.stop()
	if err := t.proc.start(ctx); err != nil {
		out.notes = append(out.notes, fmt.Sprintf("large run not made: restart Warren: %v", err))
		return out
	}
	t.uri = t.proc.uri
	// A failure of the large run is a note: the main run's figures stand.
	if _, err := measureObjects(ctx, b, t, b.cfg.DeclareLargeQueues, s10LargePattern, s10LargePrefix, &out); err != nil {
		out.notes = append(out.notes, fmt.Sprintf("large run FAILED: %v", err))
	}
	return out
}

// measureObjects declares n pairs on t, measures memory and, for a broker the bench started,
// the restart, and adds values (keys prefixed by prefix) and notes to out. It reports whether
// every pair was declared (and, after a restart, found), or why the measurement failed.
func measureObjects(ctx context.Context, b *bencher, t *benchTarget, n int, pattern, prefix string, out *runOutcome) (bool, error) {
	what := fmt.Sprintf("%s queues", fmtInt(uint64(n)))
	note := func(format string, args ...any) {
		out.notes = append(out.notes, what+": "+fmt.Sprintf(format, args...))
	}
	channels, conns := b.cfg.DeclareChannels, b.cfg.DeclareConnections
	if t.proc == nil {
		// Leftovers of an interrupted run would slow the declares and skew the memory.
		if err := deleteQueues(ctx, t.uri, pattern, n, channels); err != nil {
			note("deleting leftovers of an earlier run: %v", err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), refCleanupLimit)
			defer cancel()
			began := time.Now()
			if err := deleteQueues(cctx, t.uri, pattern, n, channels); err != nil {
				note("deleting the declared queues: %v", err)
			} else {
				fmt.Fprintf(b.cfg.Log, "S10 %s: deleted the %s declared queues in %.1f s\n", t.name, fmtInt(uint64(n)), time.Since(began).Seconds())
			}
		}()
	}
	pid, pidErr := t.pid()
	var rss0 uint64
	if pidErr == nil {
		if !sleepCtx(ctx, time.Second) {
			return false, ctx.Err()
		}
		if rss0, pidErr = b.settledRSS(ctx, pid); pidErr != nil {
			pid = 0
		}
	}
	if pidErr != nil {
		pid = 0
		note("no memory or CPU readings: %v", pidErr)
	}
	res, err := Declare(ctx, DeclareConfig{
		URI: t.uri, Queues: n, Channels: channels, Connections: conns, Pattern: pattern,
		Window: declareWindow, Timeout: b.cfg.DeclareTimeout, PID: pid,
		Progress: prefixWriter{w: b.cfg.Log, prefix: fmt.Sprintf("S10 %s, %s: ", t.name, what)},
	})
	if err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	set := func(key string, v float64) { out.values[prefix+key] = v }
	set(s10Declared, float64(res.Declared))
	set(s10FirstRate, res.FirstRate)
	set(s10LastRate, res.LastRate)
	if res.FirstCPUms > 0 {
		set(s10CPUFirst, res.FirstCPUms)
	}
	if res.LastCPUms > 0 {
		set(s10CPULast, res.LastCPUms)
	}
	complete := res.Declared == n
	if complete {
		set(s10Total, res.Seconds)
	}
	switch {
	case res.FirstError != "":
		return false, fmt.Errorf("%s: %d of %d declared: %s", what, res.Declared, n, res.FirstError)
	case res.TimedOut:
		note("declared only %s pairs within %s (%.0f pairs/s at the end); the rates, restart and memory figures are for those",
			fmtInt(uint64(res.Declared)), b.cfg.DeclareTimeout, res.LastRate)
	case !complete:
		note("declared %s of %s pairs (interrupted)", fmtInt(uint64(res.Declared)), fmtInt(uint64(n)))
	}
	if res.Declared == 0 {
		return false, nil
	}
	note("declared in %.1f s (%s pairs/s overall, %s over the first %s, %s over the last %s)", res.Seconds, fmtRate(res.Rate),
		fmtRate(res.FirstRate), fmtInt(uint64(min(declareWindow, res.Declared))), fmtRate(res.LastRate), fmtInt(uint64(min(declareWindow, res.Declared))))

	if pid != 0 {
		if rss1, err := b.settledRSS(ctx, pid); err == nil {
			set(s10RSS, (float64(rss1)-float64(rss0))/float64(res.Declared)/1024)
			note("RSS %s MB fresh -> %s MB idle with the queues", fmtRate(float64(rss0)/(1<<20)), fmtRate(float64(rss1)/(1<<20)))
		} else {
			note("memory after declaring not read: %v", err)
		}
	}
	if t.proc == nil {
		return complete, nil
	}

	stopped, accepted, err := t.proc.restart(ctx, restartLimit)
	if err != nil {
		return false, fmt.Errorf("%s: restart: %w", what, err)
	}
	ready, err := waitPassive(ctx, t.uri, res.Last, restartLimit-accepted)
	if err != nil {
		return false, fmt.Errorf("%s: after restart: %w", what, err)
	}
	set(s10RestartAccept, accepted.Seconds())
	set(s10RestartReady, (accepted + ready).Seconds())
	note("stopping with SIGTERM took %.2f s; restarted, the port accepted after %.2f s and %s answered after %.2f s",
		stopped.Seconds(), accepted.Seconds(), res.Last, (accepted + ready).Seconds())
	chk := checkQueues(ctx, t.uri, pattern, res.Declared, channels)
	if chk.Err != nil {
		return false, fmt.Errorf("%s: check after restart: %w", what, chk.Err)
	}
	set(s10Present, float64(chk.Present))
	if chk.Missing > 0 {
		note("%s of %s declared queues MISSING after restart (first: %s)", fmtInt(uint64(chk.Missing)), fmtInt(uint64(res.Declared)), chk.FirstMissing)
	}
	if err := checkBindings(ctx, t.uri, sampleNames(pattern, res.Declared, 10, res.Last)); err != nil {
		note("binding check after restart FAILED: %v", err)
	}
	if pid2 := t.proc.pid(); pid != 0 && pid2 != 0 {
		if rss2, err := b.settledRSS(ctx, pid2); err == nil {
			set(s10RSSRestart, (float64(rss2)-float64(rss0))/float64(res.Declared)/1024)
			note("RSS %s MB idle after the restart and the checks", fmtRate(float64(rss2)/(1<<20)))
		}
	}
	return complete && chk.Missing == 0, nil
}

// settledRSS is pid's settled RSS, waiting at most the bench's settle limit.
func (b *bencher) settledRSS(ctx context.Context, pid int) (uint64, error) {
	limit := b.cfg.rssSettleLimit
	if limit == 0 {
		limit = 15 * time.Second
	}
	return settledRSSWithin(ctx, pid, limit)
}

// waitPassive polls, every 10 ms for at most limit, until queue answers a passive declare on
// uri; it returns how long that took.
func waitPassive(ctx context.Context, uri, queue string, limit time.Duration) (time.Duration, error) {
	began := time.Now()
	var last error
	for {
		conn, err := amqp.DialConfig(uri, amqp.Config{Locale: "en_US", Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			var ch *amqp.Channel
			if ch, err = conn.Channel(); err == nil {
				_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			}
			_ = conn.Close()
			if err == nil {
				return time.Since(began), nil
			}
		}
		last = err
		if time.Since(began) > limit {
			return 0, fmt.Errorf("queue %s did not answer a passive declare within %s: %w", queue, limit, last)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}

// sampleNames is k queue names of pattern spread evenly over 1..n, and last.
func sampleNames(pattern string, n, k int, last string) []string {
	seen := map[string]bool{last: true}
	names := []string{last}
	for i := 0; i < k; i++ {
		name := fmt.Sprintf(pattern, 1+i*(n-1)/max(k-1, 1))
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// prefixWriter writes each Write's bytes to w with prefix in front.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	if p.w == nil {
		return len(b), nil
	}
	if _, err := io.WriteString(p.w, p.prefix+string(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// reportSection is a scenario's own table in the report, apart from the S1-S9 table.
type reportSection struct {
	title  string
	intro  string
	header []string
	right  []bool // right-aligned columns
	rows   [][]string
}

// declareRow is one row of S10's table: a metric, and the target Warren must meet, if any.
type declareRow struct {
	metric  benchMetric
	label   string
	target  string
	verdict func(get func(key string) (float64, bool)) string // "" when the row has no target
}

// declareSection is S10's table: medians per broker, the ratio, the targets and Warren's verdicts.
func declareSection(r *benchReport, sc benchScenario) reportSection {
	n, large := r.cfg.DeclareQueues, r.cfg.DeclareLargeQueues
	nq := fmtInt(uint64(n))
	wl := fmtInt(uint64(min(declareWindow, n))) // the rate window, all pairs when fewer
	metric := map[string]benchMetric{}
	for _, m := range sc.metrics {
		metric[m.key] = m
	}
	// at applies a target set for want queues only when the run was of want and all declared.
	at := func(want int, verdict func(get func(string) (float64, bool)) string) func(func(string) (float64, bool)) string {
		return func(get func(string) (float64, bool)) string {
			if n != want {
				return fmt.Sprintf("- (measured at %s)", nq)
			}
			if d, ok := get(s10Declared); ok && int(d) < n {
				return fmt.Sprintf("FAIL (with %s, not %s)", fmtInt(uint64(d)), nq)
			}
			return verdict(get)
		}
	}
	below := func(key string, limit float64, unit string) func(func(string) (float64, bool)) string {
		return func(get func(string) (float64, bool)) string {
			v, ok := get(key)
			if !ok {
				if d, ok := get(s10Declared); ok && int(d) < n {
					return "FAIL (not all declared)"
				}
				return "FAIL (not measured)"
			}
			return passFail(v < limit, fmt.Sprintf("%.2f %s", v, unit))
		}
	}
	rows := []declareRow{
		{label: fmt.Sprintf("pairs declared (of %s)", nq), metric: metric[s10Declared], target: "all",
			verdict: func(get func(string) (float64, bool)) string {
				d, ok := get(s10Declared)
				return passFail(ok && int(d) == n, "")
			}},
		{label: fmt.Sprintf("declare rate, first %s (pairs/s)", wl), metric: metric[s10FirstRate]},
		{label: fmt.Sprintf("declare rate, last %s of %s (pairs/s)", wl, nq), metric: metric[s10LastRate],
			target: fmt.Sprintf("≥ %.0f%% of the first %s", 100*s10TargetKeep, fmtInt(declareWindow)),
			verdict: func(get func(string) (float64, bool)) string {
				if n < 2*declareWindow {
					return "- (the windows overlap)"
				}
				first, ok1 := get(s10FirstRate)
				last, ok2 := get(s10LastRate)
				if !ok1 || !ok2 || first <= 0 {
					return "FAIL (not measured)"
				}
				return passFail(last >= s10TargetKeep*first, fmt.Sprintf("%.0f%%", 100*last/first))
			}},
		{label: fmt.Sprintf("time to declare %s (s)", nq), metric: metric[s10Total],
			target:  fmt.Sprintf("< %.0f s at %s", s10TargetTotal, fmtInt(s10TargetAt)),
			verdict: at(s10TargetAt, below(s10Total, s10TargetTotal, "s"))},
		{label: fmt.Sprintf("broker CPU per pair, first %s (ms)", wl), metric: metric[s10CPUFirst]},
		{label: fmt.Sprintf("broker CPU per pair, last %s of %s (ms)", wl, nq), metric: metric[s10CPULast]},
		{label: fmt.Sprintf("restart with %s queues: port accepts (s)", nq), metric: metric[s10RestartAccept]},
		{label: fmt.Sprintf("restart with %s queues: last queue answers (s)", nq), metric: metric[s10RestartReady],
			target:  fmt.Sprintf("< %.0f s at %s", s10TargetRestart, fmtInt(s10TargetAt)),
			verdict: at(s10TargetAt, below(s10RestartReady, s10TargetRestart, "s"))},
		{label: "queues present after restart", metric: metric[s10Present], target: "all declared",
			verdict: func(get func(string) (float64, bool)) string {
				p, ok1 := get(s10Present)
				d, ok2 := get(s10Declared)
				return passFail(ok1 && ok2 && p == d, "")
			}},
		{label: "idle RSS per queue after declaring (KB)", metric: metric[s10RSS],
			target: fmt.Sprintf("< %.0f KB", s10TargetRSS), verdict: below(s10RSS, s10TargetRSS, "KB")},
		{label: "idle RSS per queue after restart (KB)", metric: metric[s10RSSRestart]},
	}
	if large > n {
		lq := fmtInt(uint64(large))
		lw := fmtInt(uint64(min(declareWindow, large)))
		lm := func(key string) benchMetric { return metric[s10LargePrefix+key] }
		rows = append(rows,
			declareRow{label: fmt.Sprintf("%s queues: pairs declared", lq), metric: lm(s10Declared),
				target: fmt.Sprintf("all %s", fmtInt(s10TargetLarge)),
				verdict: func(get func(string) (float64, bool)) string {
					d, ok := get(s10LargePrefix + s10Declared)
					if !ok {
						return "FAIL (not run)"
					}
					if large < s10TargetLarge {
						return fmt.Sprintf("- (large run of %s)", lq)
					}
					return passFail(int(d) == large, "")
				}},
			declareRow{label: fmt.Sprintf("%s queues: time to declare (s)", lq), metric: lm(s10Total)},
			declareRow{label: fmt.Sprintf("%s queues: rate, first %s (pairs/s)", lq, lw), metric: lm(s10FirstRate)},
			declareRow{label: fmt.Sprintf("%s queues: rate, last %s (pairs/s)", lq, lw), metric: lm(s10LastRate)},
			declareRow{label: fmt.Sprintf("%s queues: restart, last queue answers (s)", lq), metric: lm(s10RestartReady)},
			declareRow{label: fmt.Sprintf("%s queues: idle RSS per queue (KB)", lq), metric: lm(s10RSS)},
		)
	}
	warrenGet := func(key string) (float64, bool) {
		v, k := median(r.results[sc.id][r.warren.name], key)
		return v, k > 0
	}
	sec := reportSection{
		title:  fmt.Sprintf("S10 %s", r.title(sc)),
		header: []string{"Metric", "Warren", "RabbitMQ", "Ratio", "Target (Warren)", "Warren meets it"},
		right:  []bool{false, true, true, true, false, false},
	}
	for _, row := range rows {
		w, wv, wok := r.cell(sc, row.metric, r.warren)
		f, fv, fok := r.cell(sc, row.metric, r.ref)
		if row.metric.unit == countUnit {
			w, f = countCell(w, wv, wok), countCell(f, fv, fok)
		}
		if strings.HasPrefix(row.metric.key, "restart") || strings.HasPrefix(row.metric.key, s10LargePrefix) ||
			row.metric.key == s10Present || row.metric.key == s10RSSRestart {
			if r.ref.skip == "" {
				f = "-" // the shared reference broker is never restarted, and has no large run
			}
		}
		rat := "-"
		if wok && fok && row.metric.unit != countUnit {
			if x, ok := ratio(row.metric, wv, fv); ok {
				rat = fmt.Sprintf("%.2fx", x)
			}
		}
		target, verdict := "-", "-"
		if row.verdict != nil {
			target, verdict = row.target, row.verdict(warrenGet)
		}
		sec.rows = append(sec.rows, []string{row.label, w, f, rat, target, verdict})
	}
	sec.intro = fmt.Sprintf("Median of %d runs per broker (the large run: once). %s queues; %d channels on %d connection(s) declare in parallel; each declare phase is bounded by %s. "+
		"Rates are queue.declare + queue.bind pairs per second. Ratio: higher is better for Warren. The targets are those of issue 12.",
		r.cfg.Runs, nq, r.cfg.DeclareChannels, r.cfg.DeclareConnections, r.cfg.DeclareTimeout)
	return sec
}

// countCell formats a count metric's cell as an integer.
func countCell(s string, v float64, ok bool) string {
	if !ok {
		return s
	}
	return fmtInt(uint64(v + 0.5))
}

// passFail is a verdict with an optional figure.
func passFail(ok bool, figure string) string {
	s := "FAIL"
	if ok {
		s = "PASS"
	}
	if figure != "" {
		s += " (" + figure + ")"
	}
	return s
}

// textTable renders rows under header as aligned plain text; the columns marked in right are
// right-aligned.
func textTable(header []string, rows [][]string, right []bool) string {
	width := make([]int, len(header))
	for _, row := range append([][]string{header}, rows...) {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for _, row := range append([][]string{header}, rows...) {
		var line strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i < len(right) && right[i] {
				line.WriteString(pad + c)
			} else {
				line.WriteString(c + pad)
			}
			line.WriteString("  ")
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	return b.String()
}

// mdTable renders rows under header as a Markdown table; the columns marked in right are
// right-aligned.
func mdTable(header []string, rows [][]string, right []bool) string {
	var b strings.Builder
	cells := func(row []string) {
		b.WriteString("|")
		for _, c := range row {
			b.WriteString(" " + mdEscape(c) + " |")
		}
		b.WriteString("\n")
	}
	cells(header)
	b.WriteString("|")
	for i := range header {
		if i < len(right) && right[i] {
			b.WriteString("---:|")
		} else {
			b.WriteString("---|")
		}
	}
	b.WriteString("\n")
	for _, row := range rows {
		cells(row)
	}
	return b.String()
}
