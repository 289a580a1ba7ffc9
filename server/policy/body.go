package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// ParseBody decodes the body of PUT /api/policies/{vhost}/{name} (and /api/operator-policies)
// as the management API reads it: a JSON object with pattern and definition required, priority
// defaulting to 0 and apply-to to "all". Errors are *Error with RabbitMQ's reasons: "not_json",
// "[{key_missing,pattern}]", "priority should be a number, actually was <<"7">>"... (where
// RabbitMQ answers 500 to a definition that is not an object, this is a 400 with
// "definition must be a dictionary: ..."). The result still needs Compile.
func ParseBody(vhost, name string, body []byte) (Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil || dec.More() {
		return Policy{}, &Error{Field: "body", Reason: "not_json", notValidation: true}
	}
	var missing []string
	for _, k := range []string{"pattern", "definition"} {
		if _, ok := m[k]; !ok {
			missing = append(missing, "{key_missing,"+k+"}")
		}
	}
	if len(missing) > 0 {
		field := "pattern"
		if _, ok := m["pattern"]; ok {
			field = "definition"
		}
		return Policy{}, &Error{Field: field, Reason: "[" + strings.Join(missing, ",") + "]", notValidation: true}
	}
	return FromFields(vhost, name, m)
}

// FromFields builds a Policy from the JSON-decoded fields "pattern", "definition", "priority"
// and "apply-to" (numbers as json.Number; other keys are ignored), checking their types with
// RabbitMQ's texts. An absent priority is 0 and an absent apply-to "all"; a null one is an
// error, as in RabbitMQ. Definitions files use it for policies and operator policies alike.
func FromFields(vhost, name string, fields map[string]any) (Policy, error) {
	p := Policy{VHost: vhost, Name: name, ApplyTo: ApplyToAll}
	pattern, definition := fields["pattern"], fields["definition"]
	s, ok := pattern.(string)
	if !ok {
		return Policy{}, invalid("pattern", "pattern should be a binary but was %s", erlTerm(pattern))
	}
	p.Pattern = s
	priority, hasPriority := fields["priority"]
	applyTo, hasApplyTo := fields["apply-to"]
	switch v := priority.(type) {
	case json.Number:
		f, err := v.Float64()
		if err != nil {
			return Policy{}, invalid("priority", "priority should be a number, actually was %s", erlTerm(v))
		}
		p.Priority = f
	case float64:
		p.Priority = v
	case int:
		p.Priority = float64(v)
	case int64:
		p.Priority = float64(v)
	default:
		if hasPriority {
			return Policy{}, invalid("priority", "priority should be a number, actually was %s", erlTerm(v))
		}
	}
	switch v := applyTo.(type) {
	case string:
		p.ApplyTo = ApplyTo(v)
	default:
		if !hasApplyTo {
			break
		}
		return Policy{}, invalid("apply-to", "apply-to '%s' unrecognised; should be one of: 'queues', 'classic_queues', "+
			" 'quorum_queues', 'streams', 'exchanges', or 'all'", strings.Trim(erlTerm(v), `"`))
	}
	switch v := definition.(type) {
	case map[string]any:
		p.Definition = v
	case Definition:
		p.Definition = v
	default:
		return Policy{}, invalid("definition", "definition must be a dictionary: %s", erlTerm(v))
	}
	return p, nil
}

// String renders a policy for logs.
func (p Policy) String() string {
	return fmt.Sprintf("policy %q in vhost %q (pattern %q, apply-to %s, priority %v)", p.Name, p.VHost, p.Pattern, p.ApplyTo, p.Priority)
}
