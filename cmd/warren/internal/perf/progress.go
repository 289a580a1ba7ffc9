package perf

import (
	"fmt"
	"time"
)

// startProgress writes a line to cfg.Progress every cfg.ProgressEvery with the rates and
// latency of the last interval; the returned function stops it and waits for it.
func (r *runner) startProgress(start time.Time) (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.cfg.ProgressEvery)
		defer t.Stop()
		var prevSent, prevConf, prevRecv uint64
		prevSnap := &histSnapshot{}
		prevAt := start
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				var sent, conf, recv uint64
				for _, p := range r.producers {
					sent += p.sent.Load()
					conf += p.confirmed.Load()
				}
				snap := &histSnapshot{}
				r.consMu.Lock()
				consumers := r.consumers
				r.consMu.Unlock()
				for _, c := range consumers {
					recv += c.received.Load()
					snap.addCounts(&c.hist)
				}
				secs := now.Sub(prevAt).Seconds()
				line := fmt.Sprintf("time %5.1fs  sent %s msg/s", now.Sub(start).Seconds(), fmtRate(float64(sent-prevSent)/secs))
				if r.cfg.Confirm > 0 {
					line += fmt.Sprintf("  confirmed %s msg/s", fmtRate(float64(conf-prevConf)/secs))
				}
				line += fmt.Sprintf("  received %s msg/s", fmtRate(float64(recv-prevRecv)/secs))
				if d := snap.sub(prevSnap); d.n > 0 {
					line += fmt.Sprintf("  latency p50 %s p99 %s", fmtMicros(us(d.quantile(0.5))), fmtMicros(us(d.quantile(0.99))))
				}
				fmt.Fprintln(r.cfg.Progress, line)
				prevSent, prevConf, prevRecv, prevSnap, prevAt = sent, conf, recv, snap, now
			}
		}
	}()
	return func() { close(quit); <-done }
}

// us converts a duration to microseconds.
func us(d time.Duration) float64 { return float64(d) / 1e3 }
