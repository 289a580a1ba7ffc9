package server

import (
	"log/slog"
	"time"

	"warren/server/auth"
	"warren/server/queue"
	"warren/server/tlsconf"
)

// Config is the broker configuration. DefaultConfig gives the defaults; cmd/warren maps flags onto it.
type Config struct {
	// StartAbort, when closed, cuts short New's waits for the cluster (the first bootstrap's
	// records need a majority): serve closes it on SIGTERM so a stop during start is prompt.
	StartAbort <-chan struct{}
	// AMQPListen is the TCP address of the AMQP 0-9-1 listener.
	AMQPListen string
	// StreamListen is the TCP address of the stream-protocol listener; empty (DefaultConfig's
	// value) turns it off. `warren serve` defaults it to 127.0.0.1:5552, RabbitMQ's port.
	StreamListen string
	// StreamTLSListen is the TCP address of the stream protocol over TLS (off when empty), with
	// the certificates of TLS (as the AMQPS listener).
	StreamTLSListen string
	// StreamAdvertisedHost and StreamAdvertisedPort are what stream clients are told to connect
	// to (metadata, open); default the listener's address.
	StreamAdvertisedHost string
	StreamAdvertisedPort int
	// StreamAuthFailureDelay is how long the stream protocol withholds its answer to a failed
	// login or a refused open (0: RabbitMQ's 3 s, streamproto.SilentCloseDelay). No flag sets
	// it; tests shorten it.
	StreamAuthFailureDelay time.Duration
	// DataDir holds the broker's data.
	DataDir string
	// Logger receives the broker's logs; nil means slog.Default().
	Logger *slog.Logger
	// Heartbeat is the heartbeat interval proposed in connection.tune (0 disables).
	Heartbeat time.Duration
	// FrameMax is the largest frame the server proposes in connection.tune.
	FrameMax uint32
	// ChannelMax is the number of channels a connection may have open at once.
	ChannelMax uint16
	// MaxMessageSize is the largest message body accepted (RabbitMQ 4.x default: 16 MiB).
	MaxMessageSize uint64
	// MemoryHighWatermark is the fraction of RAM above which publishers are blocked (default 0.4).
	MemoryHighWatermark float64
	// MemoryHighWatermarkBytes, if set, is an absolute limit and overrides MemoryHighWatermark.
	MemoryHighWatermarkBytes int64
	// ConsumerTimeout is how long a consumer may hold an unacknowledged delivery before it is
	// cancelled and its messages requeued (default 30 minutes; 0 disables). Queues override it with
	// x-consumer-timeout.
	ConsumerTimeout time.Duration
	// DiskFreeLimit is the free space on the data directory's file system below which publishers
	// are blocked (default 50 MB).
	DiskFreeLimit int64
	// Version is the broker's version, reported in connection.start's server properties. cmd/warren
	// sets it to the binary's own version (the one `warren version` prints), so the two cannot
	// disagree; the default "dev" is what a broker built without a version reports.
	Version string

	// QueueTypes are queue types added to the built-in classic, quorum and stream ones, by their
	// x-queue-type value (a new type plugs in here without touching the AMQP session).
	QueueTypes []queue.Type

	// NodeID names this node in its cluster (default "warren").
	NodeID string
	// ClusterListen is the TCP address of the cluster port (Raft and node-to-node traffic); empty
	// makes a one-node cluster without a port.
	ClusterListen string
	// ClusterPeers are the initial members, node id -> cluster address, including this node.
	ClusterPeers map[string]string
	// ClusterJoin starts the node without bootstrapping: it waits to be added to a running cluster
	// (warren cluster add).
	ClusterJoin bool

	// DefaultUser and DefaultPass are the user created when the node or cluster is first
	// bootstrapped, tagged administrator with full permissions on "/" (default guest/guest; an
	// empty DefaultUser creates none). Later starts do not change users.
	DefaultUser, DefaultPass string
	// LoopbackUsers may log in only from a loopback address (default guest, as RabbitMQ's
	// loopback_users). An empty, non-nil slice lets every user in from anywhere.
	LoopbackUsers []string

	// AMQPSListen is the TCP address of the AMQP 0-9-1 over TLS listener ("" = none); it needs
	// TLS.CertFile and TLS.KeyFile.
	AMQPSListen string
	// TLS are the certificate files of the AMQPS listener (and of the HTTPS API); Reload
	// (SIGHUP) reads them again.
	TLS tlsconf.Options
	// TLSLoginFrom is which part of a verified client certificate the EXTERNAL mechanism logs in
	// as: distinguished_name (default) or common_name.
	TLSLoginFrom auth.LoginFrom
	// LoadDefinitions is a definitions file (RabbitMQ's JSON) imported at boot; a file that
	// cannot be imported stops the boot with the reason.
	LoadDefinitions string
}

// DefaultConfig returns the configuration `warren serve` uses when given no flags.
func DefaultConfig() Config {
	return Config{
		AMQPListen:          "127.0.0.1:5672",
		DataDir:             "./warren-data",
		Heartbeat:           60 * time.Second,
		FrameMax:            131072,
		ChannelMax:          2047,
		MaxMessageSize:      16 << 20,
		MemoryHighWatermark: 0.4,
		ConsumerTimeout:     30 * time.Minute,
		DiskFreeLimit:       50_000_000,
		Version:             "dev",
		DefaultUser:         "guest",
		DefaultPass:         "guest",
		LoopbackUsers:       []string{"guest"},
		TLSLoginFrom:        auth.LoginFromDistinguishedName,
	}
}
