package server

import (
	"context"
	"fmt"
	"os"
	"time"

	"warren/server/definitions"
)

// loadTimeout bounds a boot-time import of a definitions file.
const loadTimeout = 2 * time.Minute

// loadDefinitionsFile imports a definitions file at boot (--load-definitions). A file that is
// not valid is refused whole, with every problem found, and nothing of it is imported.
func (s *Server) loadDefinitionsFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--load-definitions: %w", err)
	}
	d, err := definitions.Decode(data, definitions.Options{})
	if err != nil {
		return fmt.Errorf("--load-definitions %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	defer cancel()
	skipped, err := s.core.ImportDefinitions(ctx, d, "")
	if err != nil {
		return fmt.Errorf("--load-definitions %s: %w", path, err)
	}
	s.log.Info("definitions file loaded", "file", path, "skipped", len(skipped))
	return nil
}
