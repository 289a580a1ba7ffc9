package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"warren/server/auth"
	"warren/server/streamproto"
)

// The stream-protocol front-end (server/streamproto) beside the AMQP session, on the same core.

func (s *Server) newStreamFrontEnd() {
	if s.cfg.StreamListen == "" && s.cfg.StreamTLSListen == "" {
		return
	}
	s.stream = streamproto.New(streamproto.Config{
		Core: s.core, Logger: s.log, Heartbeat: s.cfg.Heartbeat,
		AdvertisedHost: s.cfg.StreamAdvertisedHost, AdvertisedPort: s.cfg.StreamAdvertisedPort,
		AuthFailureDelay: s.cfg.StreamAuthFailureDelay,
		Authenticate: func(user, pass string, remote net.Addr) error {
			_, err := s.core.LoginStream("PLAIN", user, pass, remote)
			var le *auth.LoginError
			if errors.As(err, &le) && strings.HasSuffix(le.Reason, "can only connect via localhost") {
				return &streamproto.LoopbackError{User: user}
			}
			return err
		},
		Grant: func(user, vhost string) (*auth.Grant, error) {
			if s.core.VHost(vhost) == nil {
				return nil, fmt.Errorf("vhost '%s' does not exist", vhost)
			}
			if err := s.core.CheckConnectionLimit(vhost, user); err != nil {
				return nil, err
			}
			return s.core.VHostGrant(user, vhost), nil
		},
	})
}

// startStream binds the stream-protocol listeners (a port in use is an error naming it) and
// serves them; nothing is served unless every listener could be bound.
func (s *Server) startStream() error {
	if s.stream == nil {
		return nil
	}
	var plain, tlsLn net.Listener
	if s.cfg.StreamListen != "" {
		ln, err := streamproto.Listen(s.cfg.StreamListen)
		if err != nil {
			return err
		}
		plain = ln
	}
	if s.cfg.StreamTLSListen != "" {
		var err error
		if s.tls == nil {
			err = fmt.Errorf("stream protocol: --stream-tls-listen %s needs a TLS certificate", s.cfg.StreamTLSListen)
		} else {
			tlsLn, err = streamproto.Listen(s.cfg.StreamTLSListen)
		}
		if err != nil {
			if plain != nil {
				plain.Close()
			}
			return err
		}
	}
	if plain != nil {
		s.log.Info("stream protocol listener started", "addr", plain.Addr().String())
		s.stream.Serve(plain)
	}
	if tlsLn != nil {
		s.log.Info("stream protocol TLS listener started", "addr", tlsLn.Addr().String())
		s.stream.ServeTLS(tlsLn, s.tls.TLSConfig())
	}
	return nil
}

// StreamAddr returns the first stream-protocol listener's address (nil when off).
func (s *Server) StreamAddr() net.Addr {
	if s.stream == nil {
		return nil
	}
	return s.stream.Addr()
}

func (s *Server) shutdownStream(ctx context.Context) error {
	if s.stream == nil {
		return nil
	}
	return s.stream.Shutdown(ctx)
}
