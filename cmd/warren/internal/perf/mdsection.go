package perf

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The reports' marked sections of a Markdown page (docs/benchmarks.md): `perf bench` and
// `perf stream` each replace their own, so that either can run alone and the hand-written
// sections between and after them stay.
const (
	benchSectionBegin  = "<!-- warren perf bench: begin -->"
	benchSectionEnd    = "<!-- warren perf bench: end -->"
	streamSectionBegin = "<!-- warren perf stream: begin -->"
	streamSectionEnd   = "<!-- warren perf stream: end -->"
)

// replaceSection puts section (which starts with begin and ends with end) in place of the
// file's section between those markers; a file without them gets it at its top (prepend) or
// at its end.
func replaceSection(path, section, begin, end string, prepend bool) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	s := string(old)
	i := strings.Index(s, begin)
	j := strings.Index(s, end)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + strings.TrimSuffix(section, "\n") + s[j+len(end):]
	case prepend:
		if s != "" {
			s = strings.TrimSuffix(section, "\n") + "\n\n" + strings.TrimLeft(s, "\n")
		} else {
			s = section
		}
	default:
		if s != "" && !strings.HasSuffix(s, "\n\n") {
			s = strings.TrimRight(s, "\n") + "\n\n"
		}
		s += section
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
