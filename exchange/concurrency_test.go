package exchange

import (
	"fmt"
	"sync"
	"testing"

	"warren/amqp"
)

// TestConcurrentUse routes while other goroutines change bindings and
// exchanges; run with -race.
func TestConcurrentUse(t *testing.T) {
	r := NewRegistry("/")
	mustDeclare(t, r, "t", "topic")
	mustDeclare(t, r, "h", "headers")
	mustBind(t, r, qb("t", "stable", "#"))
	const iterations = 300
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range iterations {
				q := fmt.Sprintf("q%d-%d", w, i%7)
				x := fmt.Sprintf("x%d-%d", w, i%5)
				if _, _, err := r.Declare(x, "fanout", false, true, false, false, nil); err != nil {
					errs <- err
					return
				}
				for _, b := range []Binding{qb("t", q, "a.*"), xb("t", x, "a.#"), qb(x, q, ""),
					{Source: "h", Dest: q, DestKind: ToQueue, Args: amqp.Table{"k": int32(i)}}} {
					if err := r.Bind(b); err != nil {
						errs <- err
						return
					}
				}
				if i%3 == 0 {
					r.RemoveQueue(q)
				}
				if i%4 == 0 {
					if err := r.Unbind(xb("t", x, "a.#")); err != nil {
						errs <- err
						return
					}
				}
				if i%11 == 0 {
					if err := r.Delete(x, false); err != nil {
						errs <- err
						return
					}
				}
				_ = r.Bindings()
				_ = r.Exchanges()
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]string, 0, 32)
			for i := range iterations * 4 {
				var ok bool
				dst, ok = r.Route(dst[:0], "t", "a.b", []string{"c"}, nil, nil)
				if !ok || !containsString(dst, "stable") {
					errs <- fmt.Errorf("route = %v, %v", dst, ok)
					return
				}
				dst, _ = r.Route(dst[:0], "h", "", nil, amqp.Table{"k": int64(i % iterations)}, nil)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, b := range r.Bindings() {
		if !exists(r, b.Source) || (b.DestKind == ToExchange && !exists(r, b.Dest)) {
			t.Errorf("dangling binding %+v", b)
		}
	}
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
