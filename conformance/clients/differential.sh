#!/usr/bin/env bash
# Differential run: the same suites against a reference RabbitMQ, compared test by test with
# Warren's results from the `make conformance` run that came just before.
#
#   make conformance REF=amqp://guest:guest@127.0.0.1:5682/
#   conformance/clients/differential.sh amqp://guest:guest@127.0.0.1:5682/   # after make conformance
#
# Warren's side is read from bin/: conformance.log (go test -v of ./conformance/),
# amqp091-integration.log and clients/*.results. The reference side is run here, into
# $DIFF_DIR/ref: the Go conformance tests with WARREN_CONFORMANCE_ADDR (tests that need a process
# of their own skip there), amqp091-go's integration suite with AMQP_URL, and
# conformance/clients/run.sh with WARREN_URL.
#
# Each side becomes one "PASS|FAIL|SKIP <suite>/<test>" line per test in $DIFF_DIR/{warren,ref}/;
# the script prints each test whose outcome differs, and counts. Exit status: 1 when a test
# failed against the reference (the suites are written to pass there, so that is a bug in a
# test or in the reference setup), otherwise 0: Warren's own failures already fail
# `make conformance`.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 amqp://user:pass@host:port/" >&2
  exit 2
fi
REF=$1
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${WARREN_BIN:-$ROOT/bin/warren}
DIFF_DIR=${DIFF_DIR:-$ROOT/bin/differential}
hostport=$(sed -E 's#^amqps?://([^@/]*@)?([^/?]*).*#\2#' <<<"$REF")

rm -rf "$DIFF_DIR"
mkdir -p "$DIFF_DIR/warren" "$DIFF_DIR/ref"

# go_results LOG SUITE: "--- PASS: TestX/sub (0.01s)" lines (any depth) as result lines.
go_results() {
  sed -nE "s#^[[:space:]]*--- (PASS|FAIL|SKIP): ([^ ]+).*#\1 $2/\2#p" "$1" | sort -u -k2
}

# Warren's side, from the run that `make conformance` just did.
for f in "$ROOT/bin/conformance.log" "$ROOT/bin/amqp091-integration.log"; do
  [[ -f $f ]] || { echo "differential: $f is missing: run make conformance first" >&2; exit 2; }
done
go_results "$ROOT/bin/conformance.log" go-conformance >"$DIFF_DIR/warren/go-conformance.results"
go_results "$ROOT/bin/amqp091-integration.log" amqp091 >"$DIFF_DIR/warren/amqp091.results"
cp "$ROOT"/bin/clients/*.results "$DIFF_DIR/warren/" 2>/dev/null ||
  { echo "differential: bin/clients/*.results are missing: run make conformance first" >&2; exit 2; }

echo "== differential: the same suites against the reference at $REF"
if ! (exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}") 2>/dev/null; then
  echo "differential: nothing listens on $hostport; start the reference first" \
    "(../shared/tools/rabbitmq.sh start)" >&2
  exit 1
fi

echo "-- Go conformance tests (WARREN_CONFORMANCE_ADDR=$hostport; log: $DIFF_DIR/ref/go-conformance.log)"
(cd "$ROOT" && WARREN_CONFORMANCE_ADDR=$hostport WARREN_BIN=$BIN \
  go test -count=1 -timeout 10m -v ./conformance/) >"$DIFF_DIR/ref/go-conformance.log" 2>&1
go_results "$DIFF_DIR/ref/go-conformance.log" go-conformance >"$DIFF_DIR/ref/go-conformance.results"

echo "-- amqp091-go integration suite (AMQP_URL=$REF)"
AMQP_URL=$REF CONFORMANCE_LOG_DIR=$DIFF_DIR/ref "$ROOT/conformance/amqp091-integration.sh" 2>&1 |
  grep -E '^amqp091-integration: (top-level|including)'
go_results "$DIFF_DIR/ref/amqp091-integration.log" amqp091 >"$DIFF_DIR/ref/amqp091.results"

echo "-- client suites"
WARREN_URL=$REF RESULTS_DIR=$DIFF_DIR/ref "$ROOT/conformance/clients/run.sh" 2>&1 |
  grep -E '^clients: [0-9]+ passed|^== [a-z0-9-]+: (SKIPPED|FAILED)'

# Compare. Each side: all result files, one "OUTCOME name" per test.
cat "$DIFF_DIR"/warren/*.results | sort -u -k2 >"$DIFF_DIR/warren.all"
cat "$DIFF_DIR"/ref/*.results | sort -u -k2 >"$DIFF_DIR/ref.all"

echo "== per suite (warren | rabbitmq)"
for f in "$DIFF_DIR"/warren/*.results; do
  s=$(basename "$f" .results)
  r=$DIFF_DIR/ref/$s.results
  c() { grep -c "^$1 " "$2" 2>/dev/null || true; }
  printf '%-16s warren: %3d passed, %3d failed, %3d skipped | rabbitmq: %3d passed, %3d failed, %3d skipped\n' \
    "$s" "$(c PASS "$f")" "$(c FAIL "$f")" "$(c SKIP "$f")" "$(c PASS "$r")" "$(c FAIL "$r")" "$(c SKIP "$r")"
done

echo "== tests whose outcome differs (warren -> rabbitmq; '-' means not run on that side)"
# Ordered: failing only on Warren, then failing on RabbitMQ, then skipped or absent on one side.
awk '
  FNR == NR { ref[$2] = $1; next }
  { w[$2] = $1 }
  END {
    for (n in ref) if (!(n in w)) w[n] = "-"
    for (n in w) {
      r = (n in ref) ? ref[n] : "-"
      if (w[n] == r) continue
      rank = (w[n] == "FAIL") ? 1 : (r == "FAIL") ? 2 : 3
      printf "%d %-4s -> %-4s %s\n", rank, w[n], r, n
    }
  }' "$DIFF_DIR/ref.all" "$DIFF_DIR/warren.all" | sort -k1,1n -k5 | cut -d' ' -f2- >"$DIFF_DIR/differences.txt"
cat "$DIFF_DIR/differences.txt"

warren_only=$(grep -cE '^FAIL ' "$DIFF_DIR/differences.txt" || true)
ref_fail=$(grep -c '^FAIL ' "$DIFF_DIR/ref.all" || true)
total=$(wc -l <"$DIFF_DIR/differences.txt")
echo "differential: $total tests differ; $warren_only fail only on warren; $ref_fail fail on rabbitmq" \
  "(lists: $DIFF_DIR/differences.txt)"
if [[ $ref_fail -ne 0 ]]; then
  echo "differential: tests that fail against the reference (a test bug or a reference problem):"
  grep '^FAIL ' "$DIFF_DIR/ref.all" | sed 's/^/   /'
  exit 1
fi
exit 0
