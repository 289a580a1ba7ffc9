package session

import (
	"strings"

	"warren/amqp"
)

// maxTTL is RabbitMQ's largest TTL or expiry: ten years in milliseconds.
const maxTTL = 315360000000

// parseExpiration reads a per-message expiration property (milliseconds as a decimal string), with
// RabbitMQ's texts for bad values.
func parseExpiration(s string) (int64, *amqp.Error) {
	if s == "" {
		return -1, nil
	}
	i := 0
	neg := false
	if s[0] == '-' || s[0] == '+' {
		neg, i = s[0] == '-', 1
	}
	start := i
	var n int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		if n <= maxTTL {
			n = n*10 + int64(s[i]-'0')
		}
		i++
	}
	digits := strings.TrimLeft(s[start:i], "0")
	if digits == "" {
		digits = "0"
	}
	switch {
	case i == start:
		return 0, amqp.Errorf(amqp.PreconditionFailed, "invalid expiration '%s': no_integer", s)
	case i < len(s):
		return 0, amqp.Errorf(amqp.PreconditionFailed, "invalid expiration '%s': {leftover_string,\"%s\"}", s, s[i:])
	case neg && n != 0:
		return 0, amqp.Errorf(amqp.PreconditionFailed, "invalid expiration '%s': {value_negative,-%s}", s, digits)
	case n > maxTTL:
		return 0, amqp.Errorf(amqp.PreconditionFailed, "invalid expiration '%s': {value_too_large,%s}", s, digits)
	}
	return n, nil
}
