package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"warren/stream"
)

// keySpec is what RabbitMQ registers for one definition key: its validator (nil when a group
// validator checks it with other keys), whether operator policies may set it, and whether
// Warren acts on it.
type keySpec struct {
	check    func(v any) string // "" when valid, else RabbitMQ's text
	operator bool
	ignored  bool
}

// maxStreamSegmentSize is RabbitMQ's ?MAX_STREAM_MAX_SEGMENT_SIZE.
const maxStreamSegmentSize = 3_000_000_000

// keySpecs are the keys RabbitMQ's core and its bundled plugins register as policy_validator
// (and operator_policy_validator) in 3.10 to 4.x, with rabbit_policies' checks and texts.
var keySpecs = map[string]keySpec{
	"alternate-exchange":            {check: str("%s is not a valid alternate exchange name")},
	"dead-letter-exchange":          {check: str("%s is not a valid dead letter exchange name")},
	"dead-letter-routing-key":       {check: str("%s is not a valid dead letter routing key")},
	"dead-letter-strategy":          {check: oneOf("%s is not a valid dead letter strategy", "at-most-once", "at-least-once")},
	"message-ttl":                   {check: intRange("%s is not a valid message TTL", 0, math.MaxInt64), operator: true},
	"expires":                       {check: intRange("%s is not a valid queue expiry", 1, math.MaxInt64), operator: true},
	"max-length":                    {check: intRange("%s is not a valid maximum length", 0, math.MaxInt64), operator: true},
	"max-length-bytes":              {check: intRange("%s is not a valid maximum length in bytes", 0, math.MaxInt64), operator: true},
	"overflow":                      {check: oneOf("%s is not a valid overflow value", "drop-head", "reject-publish", "reject-publish-dlx"), operator: true},
	"delivery-limit":                {check: intRange("%s is not a valid delivery limit", math.MinInt64, math.MaxInt64), operator: true},
	"max-age":                       {check: maxAge},
	"stream-max-segment-size-bytes": {check: intRange("%s is not a valid segment size", 0, maxStreamSegmentSize)},
	"stream-filter-size-bytes":      {check: intRange("%s is not a valid filter size. Valid range is 16-255", 16, 255)},
	"queue-leader-locator":          {check: oneOf("%s is not a valid queue leader locator value", "client-local", "balanced", "random", "least-leaders")},
	"initial-cluster-size":          {check: intRange("%s is not a valid cluster size", 0, math.MaxInt64)},
	"consumer-timeout":              {check: intRange("%s is not a valid consumer timeout", 0, math.MaxInt64)},

	// Accepted, kept and shown, but without effect in Warren.
	"max-in-memory-length":          {check: intRange("%s is not a valid maximum memory in bytes", 0, math.MaxInt64), operator: true, ignored: true},
	"max-in-memory-bytes":           {check: intRange("%s is not a valid maximum memory in bytes", 0, math.MaxInt64), operator: true, ignored: true},
	"queue-mode":                    {check: oneOf("%s is not a valid queue-mode value", "default", "lazy"), ignored: true},
	"queue-version":                 {check: intIn("%s is not a valid queue-version value", 1, 2), operator: true, ignored: true},
	"queue-master-locator":          {check: oneOf("%s invalid queue-master-locator value", "min-masters", "client-local", "random", "balanced", "least-leaders"), operator: true, ignored: true},
	"consumer-disconnected-timeout": {check: intRange("%s is not a valid consumer disconnected timeout", 0, math.MaxInt64), ignored: true},
	"target-group-size":             {check: intRange("%s is not a valid qq target count value", 1, math.MaxInt64), operator: true, ignored: true},
	"member-placement-tag":          {check: nonEmptyStr("%s is not a valid member-placement-tag value. Must be a non-empty string"), operator: true, ignored: true},
	"delayed-retry-type":            {check: oneOf("%s is not a valid delayed retry type. Must be one of: all, failed, returned, disabled", "all", "failed", "returned", "disabled"), operator: true, ignored: true},
	"delayed-retry-min":             {check: intRange("%s is not a valid delayed retry minimum delay. Must be a positive integer", 1, math.MaxInt64), operator: true, ignored: true},
	"delayed-retry-max":             {check: intRange("%s is not a valid delayed retry maximum delay. Must be a positive integer", 1, math.MaxInt64), operator: true, ignored: true},
	// Classic queue mirroring (removed in RabbitMQ 4.0): validateMirroring checks them together.
	"ha-mode":                {ignored: true},
	"ha-params":              {ignored: true},
	"ha-sync-mode":           {ignored: true},
	"ha-sync-batch-size":     {ignored: true},
	"ha-promote-on-shutdown": {ignored: true},
	"ha-promote-on-failure":  {ignored: true},
	// The federation plugin's keys: validateFederation checks them together.
	"federation-upstream":         {ignored: true},
	"federation-upstream-set":     {ignored: true},
	"federation-upstream-pattern": {ignored: true},
}

// unsupported lists, per queue type, the keys whose presence makes a whole policy inapplicable
// to queues of that type (the unsupported_policies of each queue type's capabilities() in
// RabbitMQ 4.x). Exchanges take any policy.
var unsupported = [numObjectTypes][]string{
	ClassicQueue: {"max-age", "stream-max-segment-size-bytes", "initial-cluster-size",
		"delivery-limit", "dead-letter-strategy", "max-in-memory-length", "max-in-memory-bytes",
		"target-group-size"},
	QuorumQueue: {"max-priority", "queue-mode", "ha-mode", "ha-params", "ha-sync-mode",
		"ha-promote-on-shutdown", "ha-promote-on-failure", "queue-master-locator",
		"max-age", "stream-max-segment-size-bytes", "initial-cluster-size"},
	Stream: {"expires", "message-ttl", "dead-letter-exchange", "dead-letter-routing-key",
		"max-length", "max-in-memory-length", "max-in-memory-bytes", "max-priority", "overflow",
		"queue-mode", "delivery-limit", "ha-mode", "ha-params", "ha-sync-mode",
		"ha-promote-on-shutdown", "ha-promote-on-failure", "queue-master-locator",
		"dead-letter-strategy", "target-group-size"},
}

func applicable(t ObjectType, def Definition) bool {
	for _, k := range unsupported[t] {
		if _, ok := def[k]; ok {
			return false
		}
	}
	return true
}

// intValue reads an integer as RabbitMQ's is_integer sees it: a JSON integer literal or a Go
// integer; floats (1000.0, 1e3) are not integers. Literals beyond int64 saturate, keeping their
// meaning as a very large (or very negative) limit.
func intValue(v any) (int64, bool) {
	switch v := v.(type) {
	case json.Number:
		s := string(v)
		if !isIntLiteral(s) {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
				if s[0] == '-' {
					return math.MinInt64, true
				}
				return math.MaxInt64, true
			}
			return 0, false
		}
		return n, true
	case int:
		return int64(v), true
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint64:
		if v > math.MaxInt64 {
			return math.MaxInt64, true
		}
		return int64(v), true
	}
	return 0, false
}

func intRange(text string, lo, hi int64) func(any) string {
	return func(v any) string {
		if n, ok := intValue(v); ok && n >= lo && n <= hi {
			return ""
		}
		return fmt.Sprintf(text, erlTerm(v))
	}
}

func intIn(text string, allowed ...int64) func(any) string {
	return func(v any) string {
		if n, ok := intValue(v); ok && slices.Contains(allowed, n) {
			return ""
		}
		return fmt.Sprintf(text, erlTerm(v))
	}
}

func str(text string) func(any) string {
	return func(v any) string {
		if _, ok := v.(string); ok {
			return ""
		}
		return fmt.Sprintf(text, erlTerm(v))
	}
}

func nonEmptyStr(text string) func(any) string {
	return func(v any) string {
		if s, ok := v.(string); ok && s != "" {
			return ""
		}
		return fmt.Sprintf(text, erlTerm(v))
	}
}

func oneOf(text string, allowed ...string) func(any) string {
	return func(v any) string {
		if s, ok := v.(string); ok && slices.Contains(allowed, s) {
			return ""
		}
		return fmt.Sprintf(text, erlTerm(v))
	}
}

func maxAge(v any) string {
	if s, ok := v.(string); ok {
		if _, err := stream.ParseMaxAge(s); err == nil {
			return ""
		}
	}
	return fmt.Sprintf("%s is not a valid max age", erlTerm(v))
}

// validateMirroring is rabbit_mirror_queue_misc:validate_policy (3.x): ha-mode must come with
// the other ha-* keys, and ha-params must suit the mode.
func validateMirroring(def Definition) error {
	mode, hasMode := def["ha-mode"]
	others := []string{"ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown", "ha-promote-on-failure"}
	if !hasMode {
		for _, k := range others {
			if _, ok := def[k]; ok {
				return &Error{Field: k, Reason: "ha-mode must be specified to specify ha-params, ha-sync-mode or ha-promote-on-shutdown"}
			}
		}
		return nil
	}
	params, hasParams := def["ha-params"]
	paramsText := "none"
	if hasParams {
		paramsText = erlTerm(params)
	}
	switch mode {
	case "all":
		if hasParams {
			return invalid("ha-params", `ha-mode="all" does not take parameters`)
		}
	case "exactly":
		if n, ok := intValue(params); !hasParams || !ok || n <= 0 {
			return invalid("ha-params", `ha-mode="exactly" takes an integer, %s given`, paramsText)
		}
	case "nodes":
		list, ok := params.([]any)
		if !hasParams || !ok {
			return invalid("ha-params", `ha-mode="nodes" takes a list, %s given`, paramsText)
		}
		if len(list) == 0 {
			return invalid("ha-params", `ha-mode="nodes" list must be non-empty`)
		}
		var bad []any
		for _, n := range list {
			if _, ok := n.(string); !ok {
				bad = append(bad, n)
			}
		}
		if len(bad) > 0 {
			return invalid("ha-params", `ha-mode="nodes" takes a list of strings, %s was not a string`, erlTerm(bad))
		}
	default:
		return invalid("ha-mode", "%s is not a valid ha-mode value", erlTerm(mode))
	}
	if v, ok := def["ha-sync-mode"]; ok && v != "automatic" && v != "manual" {
		return invalid("ha-sync-mode", `ha-sync-mode must be "manual" or "automatic", got %s`, erlTerm(v))
	}
	if v, ok := def["ha-sync-batch-size"]; ok {
		if n, isInt := intValue(v); !isInt || n <= 0 {
			return invalid("ha-sync-batch-size", "ha-sync-batch-size takes an integer greater than 0, %s given", erlTerm(v))
		}
	}
	for _, k := range []string{"ha-promote-on-shutdown", "ha-promote-on-failure"} {
		if v, ok := def[k]; ok && v != "always" && v != "when-synced" {
			return invalid(k, `%s must be "always" or "when-synced", got %s`, k, erlTerm(v))
		}
	}
	return nil
}

// validateFederation is rabbit_federation_parameters:validate_policy: one of the three keys,
// a string (and for the pattern, a regular expression).
func validateFederation(def Definition) error {
	var present []string
	for _, k := range []string{"federation-upstream", "federation-upstream-pattern", "federation-upstream-set"} {
		if _, ok := def[k]; ok {
			present = append(present, k)
		}
	}
	switch len(present) {
	case 0:
		return nil
	case 1:
	default:
		return invalid(present[0], "cannot specify federation-upstream, federation-upstream-set or federation-upstream-pattern together")
	}
	k := present[0]
	s, ok := def[k].(string)
	if !ok {
		name := map[string]string{
			"federation-upstream":         "federation upstream name",
			"federation-upstream-set":     "federation upstream set name",
			"federation-upstream-pattern": "federation upstream pattern name",
		}[k]
		return invalid(k, "%s is not a valid %s", erlTerm(def[k]), name)
	}
	if k == "federation-upstream-pattern" {
		if _, err := CompilePattern(s); err != nil {
			return invalid(k, "could not compile pattern %s to a regular expression. Error: %v", s, err)
		}
	}
	return nil
}

// validateDelayedRetry is rabbit_quorum_queue's cross-key check (4.3).
func validateDelayedRetry(def Definition) error {
	typ, hasType := def["delayed-retry-type"]
	minV, hasMin := def["delayed-retry-min"]
	if hasType && typ != "disabled" && !hasMin {
		return invalid("delayed-retry-min", "delayed-retry-min is required when delayed-retry-type is %v", typ)
	}
	lo, okMin := intValue(minV)
	hi, okMax := intValue(def["delayed-retry-max"])
	if okMin && okMax && hi < lo {
		return invalid("delayed-retry-max", "delayed-retry-max (%d) must not be smaller than delayed-retry-min (%d)", hi, lo)
	}
	return nil
}
