package stream

import (
	"fmt"
	"math"
	"time"
)

// ParseOffsetSpec resolves an x-stream-offset consumer argument with RabbitMQ's semantics:
// "first" -> First(); "last" -> LastChunk(); "next" -> Next(); an integer (any AMQP integer type) -> that
// offset, raised to First() if below it (a number past the end makes the consumer wait for it); a
// time.Time (AMQP timestamp) -> OffsetAt; an interval string in x-max-age syntax ("1h", "30m", "7D",
// "1Y", "2M", "10s") -> OffsetAt(now - interval). Anything else is an error.
func (l *Log) ParseOffsetSpec(v any, now time.Time) (uint64, error) {
	var n int64
	switch x := v.(type) {
	case string:
		switch x {
		case "first":
			return l.First(), nil
		case "last":
			return l.LastChunk(), nil
		case "next":
			return l.Next(), nil
		}
		d, err := ParseMaxAge(x)
		if err != nil {
			return 0, fmt.Errorf("invalid x-stream-offset %q: %w", x, err)
		}
		return l.OffsetAt(now.Add(-d).UnixMilli()), nil
	case time.Time:
		return l.OffsetAt(x.UnixMilli()), nil
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case int:
		n = int64(x)
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case uint:
		return l.clampOffset(uint64(x)), nil
	case uint64:
		return l.clampOffset(x), nil
	default:
		return 0, fmt.Errorf("invalid x-stream-offset %v (%T)", v, v)
	}
	if n < 0 {
		return l.First(), nil
	}
	return l.clampOffset(uint64(n)), nil
}

func (l *Log) clampOffset(o uint64) uint64 {
	return max(o, l.First())
}

// ParseMaxAge parses an x-max-age value: a positive integer followed by one unit, Y (365 days), M (30
// days), D (days), h, m or s; for example "7D", "1h", "30m", "10s".
func ParseMaxAge(s string) (time.Duration, error) {
	if len(s) < 2 {
		return 0, fmt.Errorf("invalid max age %q: want a number followed by one of Y M D h m s", s)
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 'Y':
		unit = 365 * 24 * time.Hour
	case 'M':
		unit = 30 * 24 * time.Hour
	case 'D':
		unit = 24 * time.Hour
	case 'h':
		unit = time.Hour
	case 'm':
		unit = time.Minute
	case 's':
		unit = time.Second
	default:
		return 0, fmt.Errorf("invalid max age %q: unknown unit %q (want one of Y M D h m s)", s, s[len(s)-1])
	}
	var n int64
	for _, c := range s[:len(s)-1] {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("invalid max age %q: want a number followed by one of Y M D h m s", s)
		}
		if n > (math.MaxInt64-9)/10 {
			return 0, fmt.Errorf("invalid max age %q: too large", s)
		}
		n = n*10 + int64(c-'0')
	}
	if n <= 0 {
		return 0, fmt.Errorf("invalid max age %q: must be positive", s)
	}
	if n > int64(math.MaxInt64/unit) {
		return 0, fmt.Errorf("invalid max age %q: too large", s)
	}
	return time.Duration(n) * unit, nil
}
