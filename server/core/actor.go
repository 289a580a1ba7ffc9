package core

import "context"

// Actor is who asked for a change to an exchange, queue or stream: the operators' log lines say
// it ("queue declared ... user=... connection=... via=amqp091"). It travels in the request's
// context (WithActor) because it is request-scoped metadata that no decision depends on.
type Actor struct {
	// User is the authenticated user.
	User string
	// Connection names the client connection (RabbitMQ's "peer -> local"); empty through the
	// HTTP API.
	Connection string
	// Via is how the request came: "amqp091", "stream", "http", or "definitions" (a file
	// loaded at boot).
	Via string
	// Peer is the client's address (the HTTP client's for "http").
	Peer string
}

type actorKey struct{}

// WithActor returns ctx carrying a, for the log lines of the changes made with it.
func WithActor(ctx context.Context, a Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// actorOf is the actor ctx carries (the zero Actor if none: an internal change).
func actorOf(ctx context.Context) Actor {
	a, _ := ctx.Value(actorKey{}).(Actor)
	return a
}

// logArgs are the actor's fields for a log line; an internal change says via=internal.
func (a Actor) logArgs() []any {
	if a.Via == "" {
		return []any{"via", "internal"}
	}
	args := []any{"user", a.User, "via", a.Via}
	if a.Connection != "" {
		args = append(args, "connection", a.Connection)
	}
	if a.Peer != "" {
		args = append(args, "peer", a.Peer)
	}
	return args
}

// logChange logs that what (queue, stream, exchange) name in the vhost was declared or deleted,
// by whom (the actor in ctx), with extra fields.
func (v *VHost) logChange(ctx context.Context, msg, what, name string, extra ...any) {
	args := append([]any{"vhost", v.name, what, name}, extra...)
	v.b.log.Info(msg, append(args, actorOf(ctx).logArgs()...)...)
}
