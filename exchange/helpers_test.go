package exchange

import (
	"fmt"
	"testing"

	"warren/amqp"
)

func mustDeclare(t testing.TB, r *Registry, name, kind string) *Exchange {
	t.Helper()
	x, _, err := r.Declare(name, kind, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("declare %q: %v", name, err)
	}
	return x
}

func mustDeclareArgs(t testing.TB, r *Registry, name, kind string, autoDelete bool, args amqp.Table) {
	t.Helper()
	if _, _, err := r.Declare(name, kind, false, autoDelete, false, false, args); err != nil {
		t.Fatalf("declare %q: %v", name, err)
	}
}

func mustBind(t testing.TB, r *Registry, b Binding) {
	t.Helper()
	if err := r.Bind(b); err != nil {
		t.Fatalf("bind %+v: %v", b, err)
	}
}

func mustUnbind(t testing.TB, r *Registry, b Binding) {
	t.Helper()
	if err := r.Unbind(b); err != nil {
		t.Fatalf("unbind %+v: %v", b, err)
	}
}

func qb(src, queue, key string) Binding {
	return Binding{Source: src, Dest: queue, DestKind: ToQueue, Key: key}
}

func xb(src, dest, key string) Binding {
	return Binding{Source: src, Dest: dest, DestKind: ToExchange, Key: key}
}

// outcome renders an error as RabbitMQ's client would show it, "ok" for nil.
func outcome(err *amqp.Error) string {
	if err == nil {
		return "ok"
	}
	return fmt.Sprintf("%d %s", err.Code, err.Text)
}

func exists(r *Registry, name string) bool {
	_, ok := r.Get(name)
	return ok
}
