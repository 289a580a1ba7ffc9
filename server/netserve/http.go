package netserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// HTTPListener is an HTTP server on one listener: the management API and the Prometheus exporter
// both serve this way, so they start, log and stop alike.
type HTTPListener struct {
	name string
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// ServeHTTP serves h on ln until Shutdown; name ("HTTP API", "Prometheus exporter") prefixes
// errors, and the server's own complaints (bad requests, TLS handshakes) go to log as warnings.
// connContext, if set, is the server's ConnContext.
func ServeHTTP(name string, ln net.Listener, h http.Handler, log *slog.Logger,
	connContext func(context.Context, net.Conn) context.Context) *HTTPListener {
	if log == nil {
		log = slog.Default()
	}
	l := &HTTPListener{
		name: name,
		srv: &http.Server{
			Handler:           h,
			ConnContext:       connContext,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		ln:   ln,
		done: make(chan error, 1),
	}
	go func() { l.done <- l.srv.Serve(ln) }()
	return l
}

// Addr is the address the server listens on.
func (l *HTTPListener) Addr() net.Addr { return l.ln.Addr() }

// Shutdown stops the server: no new requests, and it waits, bounded by ctx, for those under way.
func (l *HTTPListener) Shutdown(ctx context.Context) error {
	err := l.srv.Shutdown(ctx)
	if serr := <-l.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("%s: shut down: %w", l.name, err)
	}
	return nil
}
