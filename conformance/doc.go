// Package conformance holds Warren's black-box tests: they build (or take from WARREN_BIN) the
// real warren binary, start it as `warren serve --amqp-listen 127.0.0.1:PORT --data-dir DIR`,
// and drive it over TCP with hand-written AMQP frames and with the amqp091-go client.
//
// Set WARREN_CONFORMANCE_ADDR=host:port to run the tests that need no process of their own
// against a broker that is already running (for example the reference RabbitMQ) instead.
// See README.md in this directory.
package conformance
