package auth

import (
	"fmt"
	"net"
	"slices"

	"warren/amqp"
)

// LoginError is a refused login. Reason is RabbitMQ's explanation for the broker's log (it never
// contains the password); the client sees only Close's text, as RabbitMQ hides the reason from
// it (rabbit_reader:auth_fail/5).
type LoginError struct {
	Mechanism string // "PLAIN", "AMQPLAIN", "EXTERNAL"
	User      string // as presented; empty if the mechanism found no name
	Reason    string
}

// Error implements error with the log line RabbitMQ writes: "PLAIN login refused: user 'u' -
// invalid credentials".
func (e *LoginError) Error() string { return e.Mechanism + " login refused: " + e.Reason }

// Close is the connection.close a client that advertises the authentication_failure_close
// capability receives before the socket closes (other clients see only the close).
func (e *LoginError) Close() *amqp.Error {
	return amqp.Errorf(amqp.AccessRefused,
		"Login was refused using authentication mechanism %s. For details see the broker logfile.", e.Mechanism)
}

// Authenticate checks a password login (PLAIN, AMQPLAIN, HTTP Basic) against the stored hash of
// user name, as RabbitMQ's internal backend does (rabbit_auth_backend_internal:
// user_login_authentication/2): a blank password is refused whatever is stored, an unknown user
// (stored == nil) and a wrong password are both "invalid credentials". cache, if not nil, holds
// this connection's previous check.
func Authenticate(mechanism, name string, stored *PasswordHash, password string, cache *Cache) error {
	if password == "" {
		return &LoginError{Mechanism: mechanism, User: name, Reason: fmt.Sprintf(
			"user '%s' attempted to log in with a blank password, which is prohibited by the internal authN backend. "+
				"To use TLS/x509 certificate-based authentication, see the rabbitmq_auth_mechanism_ssl plugin and configure the client to use the EXTERNAL authentication mechanism. "+
				"Alternatively change the password for the user to be non-blank.", name)}
	}
	ok := false
	if stored != nil {
		if cache != nil {
			ok = cache.Verify(*stored, password)
		} else {
			ok = stored.Verify(password)
		}
	}
	if !ok {
		return &LoginError{Mechanism: mechanism, User: name, Reason: fmt.Sprintf("user '%s' - invalid credentials", name)}
	}
	return nil
}

// CheckLoopback refuses a user listed in loopbackUsers (`--loopback-users`, RabbitMQ's
// `loopback_users`, default guest) connecting from anywhere but a loopback address
// (rabbit_access_control:check_user_loopback/2). It runs after the password check, so a
// wrong password is reported as such first.
func CheckLoopback(mechanism, name string, loopbackUsers []string, remote net.Addr) error {
	if !slices.Contains(loopbackUsers, name) || isLoopback(remote) {
		return nil
	}
	return &LoginError{Mechanism: mechanism, User: name, Reason: fmt.Sprintf("user '%s' can only connect via localhost", name)}
}

// isLoopback reports whether addr is a loopback IP (or a Unix socket, which is local).
func isLoopback(addr net.Addr) bool {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UDPAddr:
		return a.IP.IsLoopback()
	case *net.IPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	case nil:
		return false
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		host = addr.String()
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
