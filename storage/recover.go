package storage

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Badger repairs a torn or corrupt tail of the newest value-log file and of the memtable write-ahead logs
// (*.mem) silently when it opens: it replays entries up to the first bad one and truncates the file there.
// Those files are preallocated sparse, so after a crash the part beyond the last entry is all zeros and
// truncating it loses nothing. To say what was found, Open records for each such file where its last
// non-zero byte is before badger opens, and afterwards compares that with the size badger kept: non-zero
// bytes cut off mean damaged data was discarded.

// removeEmptyLogs deletes zero-length *.mem and *.vlog files. Badger deletes a log file by truncating it to
// zero and then unlinking it; a kill between the two leaves an empty file that badger v4.9.6 then refuses
// to open ("while opening memtables ... Create a new file"). An empty log file holds no data.
func removeEmptyLogs(dir string, log *slog.Logger) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("storage: read data directory %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".mem") && !strings.HasSuffix(name, ".vlog") {
			continue
		}
		info, err := e.Info()
		if err != nil || info.Size() != 0 || !info.Mode().IsRegular() {
			continue
		}
		path := filepath.Join(dir, name)
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("storage: remove empty log file %s: %w", path, err)
		}
		log.Warn("removed an empty log file left by an interrupted delete", "file", path)
	}
	return nil
}

// logInspection is what Open saw in one log file before badger opened it.
type logInspection struct {
	path    string
	size    int64 // file size before open
	dataEnd int64 // offset just after the last non-zero byte before open
}

// inspectLogs records the newest *.vlog file and every *.mem file in dir. Errors only cost the report, so
// they are logged at Debug and the file is skipped.
// walMemTableSize returns the memtable size the existing write-ahead logs (*.mem) were created for
// (badger creates each at twice MemTableSize), or 0. Badger replays a log into a skiplist arena sized
// by the MemTableSize it is opened with and panics ("Arena too small") when the log holds more: a
// store last written with larger memtables (16 MiB before 8 MiB became the default) and not closed
// cleanly must be opened with its own size until those logs are flushed.
func walMemTableSize(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var largest int64
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".mem") {
			continue
		}
		if fi, err := e.Info(); err == nil {
			largest = max(largest, fi.Size()/2)
		}
	}
	return largest
}

func inspectLogs(dir string, log *slog.Logger) []logInspection {
	entries, err := os.ReadDir(dir)
	if err != nil {
		log.Debug("cannot list data directory for log inspection", "dir", dir, "err", err)
		return nil
	}
	var vlogs []string
	var out []logInspection
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".vlog"):
			vlogs = append(vlogs, name)
		case strings.HasSuffix(name, ".mem"):
			if li, err := inspectLog(filepath.Join(dir, name)); err == nil {
				out = append(out, li)
			} else {
				log.Debug("cannot inspect log", "file", name, "err", err)
			}
		}
	}
	if len(vlogs) > 0 {
		sort.Slice(vlogs, func(i, j int) bool { return fileID(vlogs[i]) < fileID(vlogs[j]) })
		newest := filepath.Join(dir, vlogs[len(vlogs)-1])
		if li, err := inspectLog(newest); err == nil {
			out = append(out, li)
		} else {
			log.Debug("cannot inspect log", "file", newest, "err", err)
		}
	}
	return out
}

func fileID(name string) uint64 {
	n, _ := strconv.ParseUint(strings.TrimSuffix(name, filepath.Ext(name)), 10, 64)
	return n
}

// reportRepairs compares the files after badger opened them with what inspectLogs saw.
func reportRepairs(logs []logInspection, log *slog.Logger) {
	for _, li := range logs {
		st, err := os.Stat(li.path)
		if err != nil {
			continue // e.g. a replayed memtable already flushed and its log deleted
		}
		kept := st.Size()
		switch {
		case kept < li.dataEnd:
			log.Warn("found an incomplete or damaged entry at the end of a log after an unclean stop; discarded it and kept everything before it",
				"file", li.path, "kept_bytes", kept, "discarded_bytes", li.dataEnd-kept)
		case kept < li.size:
			log.Debug("trimmed unused preallocated log space", "file", li.path, "kept_bytes", kept)
		}
	}
}

const (
	seekData = 3 // SEEK_DATA
	seekHole = 4 // SEEK_HOLE
)

// inspectLog finds the size of path and the offset just after its last non-zero byte, skipping holes of
// sparse files when the file system can report them.
func inspectLog(path string) (logInspection, error) {
	f, err := os.Open(path)
	if err != nil {
		return logInspection{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return logInspection{}, err
	}
	li := logInspection{path: path, size: st.Size()}

	// Data extents [start, end), in file order.
	type extent struct{ start, end int64 }
	var extents []extent
	for off := int64(0); off < li.size; {
		start, err := f.Seek(off, seekData)
		if err != nil {
			break // ENXIO: no data after off; or the file system cannot tell
		}
		end, err := f.Seek(start, seekHole)
		if err != nil || end <= start {
			end = li.size
		}
		extents = append(extents, extent{start, end})
		off = end
	}
	if len(extents) == 0 {
		if _, err := f.Seek(0, seekData); err == nil || li.size == 0 {
			return li, nil // all holes
		}
		extents = []extent{{0, li.size}} // no hole support: read it all
	}

	buf := make([]byte, 1<<20)
	for i := len(extents) - 1; i >= 0; i-- {
		for end := extents[i].end; end > extents[i].start; {
			start := max(end-int64(len(buf)), extents[i].start)
			chunk := buf[:end-start]
			if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
				return li, err
			}
			if j := lastNonZero(chunk); j >= 0 {
				li.dataEnd = start + int64(j) + 1
				return li, nil
			}
			end = start
		}
	}
	return li, nil
}

func lastNonZero(b []byte) int {
	var zeros [4096]byte
	for end := len(b); end > 0; {
		start := max(end-len(zeros), 0)
		if !bytes.Equal(b[start:end], zeros[:end-start]) {
			for j := end - 1; j >= start; j-- {
				if b[j] != 0 {
					return j
				}
			}
		}
		end = start
	}
	return -1
}
