package auth

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Algorithm names a password hashing function by the RabbitMQ module that implements it, which
// is how definitions files (`hashing_algorithm`) and RabbitMQ's user records name it.
type Algorithm string

// The hashing functions RabbitMQ ships. Each stores salt ++ H(salt ++ utf8 password) with a
// 4-byte random salt (rabbit_password.erl).
const (
	SHA256 Algorithm = "rabbit_password_hashing_sha256" // RabbitMQ's default since 3.6.0
	SHA512 Algorithm = "rabbit_password_hashing_sha512"
	MD5    Algorithm = "rabbit_password_hashing_md5" // users created before 3.6.0
)

// DefaultAlgorithm is what Warren hashes new passwords with, as RabbitMQ does by default
// (`password_hashing_module`).
const DefaultAlgorithm = SHA256

// SaltSize is the length of RabbitMQ's salt, a random 32-bit integer.
const SaltSize = 4

// ErrUnknownAlgorithm is returned for a `hashing_algorithm` that is none of RabbitMQ's three.
// RabbitMQ would take it as the name of a plugin module; Warren has no such plugins.
var ErrUnknownAlgorithm = errors.New("unknown password hashing algorithm")

// ParseAlgorithm accepts a definitions file's `hashing_algorithm` value.
func ParseAlgorithm(name string) (Algorithm, error) {
	switch a := Algorithm(name); a {
	case SHA256, SHA512, MD5:
		return a, nil
	}
	return "", fmt.Errorf("%w: %q", ErrUnknownAlgorithm, name)
}

// digest writes H(salt ++ password) into d and returns its length; a must be valid. A short
// password is hashed from a buffer on the stack, so a login allocates nothing here.
func (a Algorithm) digest(d *[sha512.Size]byte, salt []byte, password string) int {
	var stack [128]byte
	in := append(append(stack[:0], salt...), password...)
	switch a {
	case SHA512:
		*d = sha512.Sum512(in)
		return sha512.Size
	case MD5:
		s := md5.Sum(in)
		return copy(d[:], s[:])
	default:
		s := sha256.Sum256(in)
		return copy(d[:], s[:])
	}
}

// size is the digest length of a.
func (a Algorithm) size() int {
	switch a {
	case SHA512:
		return sha512.Size
	case MD5:
		return md5.Size
	default:
		return sha256.Size
	}
}

// AlgorithmForVersion is the algorithm RabbitMQ assumes for a user in a definitions file that
// has no `hashing_algorithm`, given the file's `rabbit_version`
// (rabbit_auth_backend_internal:hashing_algorithm/2): exports from 3.0 to 3.5 hashed with MD5,
// 3.6.0 (which did not export the field yet) with SHA-256, and anything else, including a file
// without a version, gets the default. A user record without an algorithm at all is MD5
// (rabbit_password:hashing_mod(undefined)); that is the 3.0-3.5 case here.
func AlgorithmForVersion(rabbitVersion string) Algorithm {
	switch {
	case rabbitVersion == "3.6.0":
		return SHA256
	case strings.HasPrefix(rabbitVersion, "3.") && len(rabbitVersion) >= 4 &&
		rabbitVersion[2] >= '0' && rabbitVersion[2] <= '5' && rabbitVersion[3] == '.':
		return MD5
	}
	return DefaultAlgorithm
}

// PasswordHash is a stored credential in RabbitMQ's layout. The zero value (no hash) matches
// no password: such a user can log in only through a mechanism that needs none (EXTERNAL).
type PasswordHash struct {
	Algorithm Algorithm
	// Salted is salt ++ digest, as RabbitMQ stores it; its base64 is the definitions file's
	// `password_hash`. RabbitMQ accepts any length here; one that is not SaltSize plus the
	// digest size never verifies.
	Salted []byte
}

// HashPassword hashes password with a fresh random salt.
func HashPassword(alg Algorithm, password string) (PasswordHash, error) {
	var salt [SaltSize]byte
	rand.Read(salt[:]) // never fails (crypto/rand)
	return HashPasswordWithSalt(alg, salt, password)
}

// HashPasswordWithSalt hashes password with the given salt; tests and reproducible fixtures use
// it, everything else HashPassword.
func HashPasswordWithSalt(alg Algorithm, salt [SaltSize]byte, password string) (PasswordHash, error) {
	if _, err := ParseAlgorithm(string(alg)); err != nil {
		return PasswordHash{}, err
	}
	var d [sha512.Size]byte
	n := alg.digest(&d, salt[:], password)
	out := make([]byte, 0, SaltSize+n)
	out = append(append(out, salt[:]...), d[:n]...)
	return PasswordHash{Algorithm: alg, Salted: out}, nil
}

// ParseDefinitionHash reads a user's `password_hash` and `hashing_algorithm` from a definitions
// file whose `rabbit_version` is rabbitVersion. An empty algorithm means the field is absent
// (AlgorithmForVersion decides). An empty hash is kept: RabbitMQ imports such users, who can
// then log in only with EXTERNAL.
func ParseDefinitionHash(passwordHash, hashingAlgorithm, rabbitVersion string) (PasswordHash, error) {
	alg := AlgorithmForVersion(rabbitVersion)
	if hashingAlgorithm != "" {
		var err error
		if alg, err = ParseAlgorithm(hashingAlgorithm); err != nil {
			return PasswordHash{}, err
		}
	}
	// Erlang's base64:decode skips white space but insists on padding; so does this.
	b, err := base64.StdEncoding.DecodeString(stripBase64Space(passwordHash))
	if err != nil {
		return PasswordHash{}, fmt.Errorf("password_hash is not base64: %w", err)
	}
	return PasswordHash{Algorithm: alg, Salted: b}, nil
}

// stripBase64Space removes the white space Erlang's base64 decoder ignores.
func stripBase64Space(s string) string {
	if !strings.ContainsAny(s, " \t\r\n") {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\r' || r == '\n' {
			return -1
		}
		return r
	}, s)
}

// Encode returns the base64 text a definitions export carries as `password_hash`.
func (h PasswordHash) Encode() string { return base64.StdEncoding.EncodeToString(h.Salted) }

// IsZero reports whether there is no stored hash, so no password can match.
func (h PasswordHash) IsZero() bool { return len(h.Salted) == 0 }

// Verify reports whether password hashes to h, comparing the digests in constant time. It is
// only the hash check: RabbitMQ's refusal of blank passwords is Authenticate's.
func (h PasswordHash) Verify(password string) bool {
	if _, err := ParseAlgorithm(string(h.Algorithm)); err != nil {
		return false
	}
	if len(h.Salted) != SaltSize+h.Algorithm.size() {
		return false
	}
	var d [sha512.Size]byte
	n := h.Algorithm.digest(&d, h.Salted[:SaltSize], password)
	return subtle.ConstantTimeCompare(d[:n], h.Salted[SaltSize:]) == 1
}

// Cache remembers the last password check made for one client connection (an AMQP connection
// attempt, or an HTTP keep-alive connection whose every request carries the same Basic
// credentials), so that checking the same password against the same stored hash again costs a
// comparison instead of a hash. A changed stored hash (a new password) misses. Channels never
// check passwords: they use what the connection's login established. The zero value is ready;
// a Cache belongs to one goroutine.
type Cache struct {
	valid    bool
	ok       bool
	alg      Algorithm
	salted   []byte
	password string
}

// Verify is h.Verify(password), answered from the cache when the previous call on c had the
// same h and password.
func (c *Cache) Verify(h PasswordHash, password string) bool {
	if c.valid && c.alg == h.Algorithm && subtle.ConstantTimeCompare(c.salted, h.Salted) == 1 &&
		subtle.ConstantTimeCompare([]byte(c.password), []byte(password)) == 1 {
		return c.ok
	}
	ok := h.Verify(password)
	*c = Cache{valid: true, ok: ok, alg: h.Algorithm, salted: append([]byte(nil), h.Salted...), password: password}
	return ok
}
