package perf

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// writeJSON writes res as one JSON object and a newline.
func writeJSON(w io.Writer, res any) error {
	enc := json.NewEncoder(w)
	if err := enc.Encode(res); err != nil {
		return fmt.Errorf("write JSON result: %w", err)
	}
	return nil
}

// writeHuman writes res as a short human-readable summary.
func writeHuman(w io.Writer, res *Result) error {
	var b strings.Builder
	if ic := res.Connections; ic != nil {
		fmt.Fprintf(&b, "connections: %s opened, %s failed, in %.2f s (%s conn/s), held %.1f s\n",
			fmtInt(uint64(ic.Opened)), fmtInt(uint64(ic.Failed)), ic.OpenSeconds, fmtRate(ic.OpenRate), ic.HeldSeconds)
		if ic.FirstError != "" {
			fmt.Fprintf(&b, "first error: %s\n", ic.FirstError)
		}
		_, err := io.WriteString(w, b.String())
		return err
	}
	ack := "manual ack"
	switch {
	case res.AutoAck:
		ack = "auto-ack"
	case res.QoS > 0:
		ack = fmt.Sprintf("manual ack, prefetch %d", res.QoS)
	}
	mode := "transient"
	if res.Persistent {
		mode = "persistent"
	}
	conf := "no confirms"
	if res.Confirm > 0 {
		conf = fmt.Sprintf("confirm window %d", res.Confirm)
	}
	rate := ""
	if res.Rate > 0 {
		rate = fmt.Sprintf(", %s msg/s per producer", fmtRate(res.Rate))
	}
	fmt.Fprintf(&b, "%d producers, %d consumers, %d %s queue(s), %s exchange, %d B %s, %s, %s%s\n",
		res.Producers, res.Consumers, res.Queues, res.QueueType, res.ExchangeType, res.Size, mode, conf, ack, rate)
	fmt.Fprintf(&b, "publish : %12s msg/s  (%s messages in %.2f s)\n", fmtRate(res.PublishRate), fmtInt(res.Published), res.PublishSeconds)
	if res.Confirm > 0 {
		fmt.Fprintf(&b, "confirm : %12s msg/s  (%s confirmed, %s nacked, last after %.2f s)\n", fmtRate(res.ConfirmRate), fmtInt(res.Confirmed), fmtInt(res.Nacked), res.ConfirmSeconds)
	}
	fmt.Fprintf(&b, "consume : %12s msg/s  (%s messages in %.2f s)\n", fmtRate(res.ConsumeRate), fmtInt(res.Consumed), res.ConsumeSeconds)
	l := res.Latency
	if l.Samples > 0 {
		fmt.Fprintf(&b, "latency : p50 %s  p75 %s  p95 %s  p99 %s  max %s  (mean %s, %s samples)\n",
			fmtMicros(l.P50), fmtMicros(l.P75), fmtMicros(l.P95), fmtMicros(l.P99), fmtMicros(l.Max), fmtMicros(l.Mean), fmtInt(l.Samples))
	}
	check := "lost n/a (no publisher confirms)"
	if res.Confirm > 0 && !res.LossChecked {
		check = "lost n/a (some producers' queues had no consumer)"
	}
	if res.LossChecked {
		check = "lost " + fmtInt(res.Lost)
		if len(res.LostByProducer) > 0 {
			ids := make([]string, 0, len(res.LostByProducer))
			for id := range res.LostByProducer {
				ids = append(ids, id)
			}
			sort.Slice(ids, func(i, j int) bool { a, _ := strconv.Atoi(ids[i]); c, _ := strconv.Atoi(ids[j]); return a < c })
			parts := make([]string, len(ids))
			for i, id := range ids {
				parts[i] = fmt.Sprintf("producer %s: %s", id, fmtInt(res.LostByProducer[id]))
			}
			check += " (" + strings.Join(parts, ", ") + ")"
		}
	}
	fmt.Fprintf(&b, "check   : published %s  confirmed %s  consumed %s  %s  duplicates %s  never consumed %s",
		fmtInt(res.Published), fmtInt(res.Confirmed), fmtInt(res.Consumed), check, fmtInt(res.Duplicates), fmtInt(res.NotConsumed))
	if res.Stale > 0 {
		fmt.Fprintf(&b, "  foreign/stale %s", fmtInt(res.Stale))
	}
	b.WriteString("\n")
	for _, e := range res.Errors {
		fmt.Fprintf(&b, "error   : %s\n", e)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// fmtInt formats n with thousands separators.
func fmtInt(n uint64) string {
	s := strconv.FormatUint(n, 10)
	if len(s) <= 3 {
		return s
	}
	var b strings.Builder
	pre := len(s) % 3
	if pre > 0 {
		b.WriteString(s[:pre])
	}
	for i := pre; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// fmtRate formats a rate: whole numbers with separators, or one decimal below 100.
func fmtRate(r float64) string {
	if r < 100 {
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return fmtInt(uint64(r + 0.5))
}

// fmtMicros formats a duration given in microseconds with a fitting unit.
func fmtMicros(v float64) string {
	switch {
	case v < 1000:
		return fmt.Sprintf("%.0f µs", v)
	case v < 1e6:
		return fmt.Sprintf("%.2f ms", v/1e3)
	default:
		return fmt.Sprintf("%.2f s", v/1e6)
	}
}
