// Package amqp is Warren's AMQP 0-9-1 wire codec: frames, methods, content
// headers and properties, field tables and reply codes.
//
// The method structs in zz_spec091.go are generated from the protocol XML in
// spec/ by our own generator in internal/specgen. The hot paths (publish,
// deliver, ack, content frames) are hand-written in fast.go and frame.go and
// do not allocate.
package amqp

//go:generate go run ./internal/specgen -o zz_spec091.go spec/amqp0-9-1.stripped.extended.xml spec/warren-extensions.xml
