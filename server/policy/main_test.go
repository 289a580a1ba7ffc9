package policy

import (
	"testing"

	"go.uber.org/goleak"
)

// The package starts no goroutine; regexp2 runs a clock while backtracking patterns are timed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/dlclark/regexp2.runClock"))
}
