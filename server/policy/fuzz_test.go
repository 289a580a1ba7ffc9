package policy

import (
	"errors"
	"testing"
)

// FuzzParseCompile feeds management API bodies through ParseBody and Compile: never a panic,
// every refusal a *Error with a reason (the field may be an empty key), every accepted policy matchable.
func FuzzParseCompile(f *testing.F) {
	for _, s := range []string{
		`{"pattern":"^a","definition":{"message-ttl":1000}}`,
		`{"pattern":"^(?!amq\\.).*","apply-to":"queues","priority":3,"definition":{"ha-mode":"exactly","ha-params":2}}`,
		`{"pattern":"(a)\\1","definition":{"max-age":"7D","foo":[1,{"a":null}]}}`,
		`{"pattern":"^a","definition":{"federation-upstream-pattern":"(","delivery-limit":-1e3}}`,
		`{"pattern":"","priority":1.5,"apply-to":"streams","definition":{"stream-filter-size-bytes":16}}`,
		`nope`, `{}`, `[]`, `{"pattern":"^a","definition":[1,2,"x"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, c := range []Component{ComponentPolicy, ComponentOperatorPolicy} {
			p, err := ParseBody("v", "p", body)
			if err == nil {
				var cp *Compiled
				cp, err = Compile(c, p)
				if err == nil {
					for ty := range numObjectTypes {
						cp.Matches("some.queue", ty)
					}
					m := Match{Policy: cp, OperatorPolicy: cp}
					m.EffectiveDefinition()
					m.Queue(QuorumQueue, nil)
					continue
				}
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Reason == "" {
				t.Fatalf("refusal %v is not a *Error with a reason", err)
			}
		}
	})
}
