#!/bin/sh
# failed-lines.sh LOG: from a `go test -v` log, the lines each failed test logged itself (t.Log,
# t.Error: "file_test.go:N: ..."), without the continuation lines of multi-line logs (node logs
# dumped at a failure), at most 80 a test. `make conformance` prints them last, so that the end of
# its output, all a CI summary may keep, says why a test failed.
awk '
/^=== (RUN|CONT|NAME) / { cur = $3; next }
/^ *--- FAIL: / {
	name = $3
	print "--- FAIL: " name
	printf "%s", buf[name]
	if (n[name] > 80) print "    ... (" n[name] - 80 " more lines in the log)"
	next
}
/^ +[A-Za-z0-9_]+\.go:[0-9]+: / {
	if (++n[cur] <= 80) buf[cur] = buf[cur] $0 "\n"
}
' "$1"
