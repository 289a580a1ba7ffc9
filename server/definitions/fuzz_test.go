package definitions

import (
	"errors"
	"os"
	"testing"
)

// FuzzDecode feeds documents through Decode, Validate and Encode: never a panic; a refusal is
// an *Error with problems; an accepted document encodes, and its encoding decodes again.
func FuzzDecode(f *testing.F) {
	// The 4.x file is small enough to mutate quickly; the 3.10.8 exports (20 KB) slow the
	// fuzzer's minimisation to a crawl and are covered by the unit tests.
	for _, name := range []string{"handwritten-4x-export.json"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
	}
	for _, s := range []string{
		`{"queues":[{"name":"q","vhost":"/","arguments":{"x-queue-type":"quorum","x-max-length":1e3}}]}`,
		`{"users":[{"name":"u","tags":"a,,b","limits":{"max-connections":-1}}],"vhosts":[{"name":"v","metadata":{"tags":[]}}]}`,
		`{"parameters":[{"vhost":"v","component":"operator_policy","name":"o","value":{"pattern":"(?!x)","definition":{"expires":1}}}]}`,
		`{"bindings":[{"source":"","destination":"q","destination_type":"queue"}]}`,
		`[`, `null`, `{"policies":[{"vhost":"v","name":"p","pattern":"a","definition":{"ha-mode":"nodes","ha-params":[]}}]}`,
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, single bool) {
		opts := Options{}
		if single {
			opts.VHost = "v"
		}
		d, err := Decode(data, opts)
		if err != nil {
			var de *Error
			if !errors.As(err, &de) || len(de.Problems) == 0 {
				t.Fatalf("refusal %v is not an *Error with problems", err)
			}
			return
		}
		_ = d.Validate(func(string) bool { return true }, nil)
		out, err := Encode(d)
		if err != nil {
			t.Fatalf("Encode of a decoded document: %v", err)
		}
		if _, err := Decode(out, Options{}); err != nil {
			t.Fatalf("our own encoding does not decode: %v\n%s", err, out)
		}
	})
}
