package policy

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"strings"
	"time"

	"github.com/dlclark/regexp2"
)

// MaxPatternLength is the longest pattern accepted, in bytes (RabbitMQ 4.x's limit).
const MaxPatternLength = 1024

// patternMatchTimeout bounds one match of a backtracking pattern, as RabbitMQ bounds PCRE with
// match_limit: a pathological pattern fails to match instead of stalling a declare. regexp2
// keeps time with a goroutine of its own (regexp2.runClock) that runs while timed matches do
// and stops about a second after the last; goleak checks must ignore it (goleak.IgnoreAnyFunction).
const patternMatchTimeout = 50 * time.Millisecond

// Pattern is a compiled policy pattern. RabbitMQ matches names with PCRE, unanchored. Patterns
// that Go's RE2 accepts run on regexp (linear time, the common case: `^amq\.`, `.*`); patterns
// that need PCRE features RE2 lacks (lookaround such as the documented `^(?!amq\.).*`,
// backreferences, atomic groups) run on regexp2, a backtracking engine, with a match timeout.
type Pattern struct {
	src string
	// prefix is a literal every matching name starts with ("orders." for `^orders\.`): a
	// cheap test that rejects most names before the regexp runs, so that a declare among
	// many prefix policies costs a string comparison per policy.
	prefix string
	re2    *regexp.Regexp
	bt     *regexp2.Regexp
}

// CompilePattern compiles a policy pattern; the error text follows RabbitMQ's
// "pattern should be regular expression but is invalid: ...".
func CompilePattern(src string) (*Pattern, error) {
	if len(src) > MaxPatternLength {
		return nil, fmt.Errorf("pattern must not exceed %d bytes", MaxPatternLength)
	}
	if re, err := regexp.Compile(src); err == nil {
		return &Pattern{src: src, re2: re, prefix: anchoredPrefix(src)}, nil
	}
	bt, err := regexp2.Compile(src, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("pattern should be regular expression but is invalid: %v", err)
	}
	bt.MatchTimeout = patternMatchTimeout
	return &Pattern{src: src, bt: bt}, nil
}

// String returns the pattern as written.
func (p *Pattern) String() string { return p.src }

// MatchString reports whether the pattern matches anywhere in name.
func (p *Pattern) MatchString(name string) bool {
	if p.re2 != nil {
		return strings.HasPrefix(name, p.prefix) && p.re2.MatchString(name)
	}
	ok, err := p.bt.MatchString(name)
	return err == nil && ok
}

// anchoredPrefix returns the literal that must begin every match of a pattern anchored at the
// start of the text (`^abc...`), or "" when there is none.
func anchoredPrefix(src string) string {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return ""
	}
	re = re.Simplify()
	if re.Op != syntax.OpConcat || len(re.Sub) < 2 || re.Sub[0].Op != syntax.OpBeginText {
		return ""
	}
	lit := re.Sub[1]
	if lit.Op != syntax.OpLiteral || lit.Flags&syntax.FoldCase != 0 {
		return ""
	}
	return string(lit.Rune)
}
