#!/usr/bin/env bash
# Runs the amqp091-go client's own integration tests (`go test -tags integration`) against a
# Warren this script starts, and prints how many passed, failed and were skipped.
#
#   conformance/amqp091-integration.sh            # uses bin/warren (WARREN_BIN overrides)
#   AMQP_URL=amqp://guest:guest@127.0.0.1:5682/ conformance/amqp091-integration.sh
#                                                 # runs against a broker already running
#
# The module source comes from the Go module proxy (`go mod download`), is copied to a temporary
# directory and tested there. Tests listed in conformance/amqp091-skip.txt are not run; see
# conformance/README.md for why. Exit status: 0 if every test that ran passed.
set -euo pipefail

MODULE=github.com/rabbitmq/amqp091-go
VERSION=${AMQP091_VERSION:-v1.16.0}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${WARREN_BIN:-$ROOT/bin/warren}
SKIP_FILE=$ROOT/conformance/amqp091-skip.txt
SUITE_TIMEOUT=${AMQP091_SUITE_TIMEOUT:-10m}
LOG_DIR=${CONFORMANCE_LOG_DIR:-$ROOT/bin}
HTTP_LISTEN=${AMQP091_HTTP_LISTEN:-127.0.0.1:15672}

work=$(mktemp -d "${TMPDIR:-/tmp}/warren-amqp091.XXXXXX")
warren_pid=""
cleanup() {
  if [[ -n $warren_pid ]] && kill -0 "$warren_pid" 2>/dev/null; then
    kill -TERM "$warren_pid" 2>/dev/null || true
    wait "$warren_pid" 2>/dev/null || true
  fi
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The suite's source, from the module proxy (run outside our module so go.sum is untouched).
dir=$(cd "$work" && GOFLAGS= go mod download -json "$MODULE@$VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
if [[ -z $dir || ! -d $dir ]]; then
  echo "amqp091-integration: go mod download $MODULE@$VERSION gave no source directory" >&2
  exit 1
fi
src=$work/amqp091-go
cp -R "$dir" "$src"
chmod -R u+w "$src"

# 2. The skip list: every name must still exist in the suite, so the list cannot rot silently.
mapfile -t skips < <(sed -e 's/#.*//' "$SKIP_FILE" | awk 'NF {print $1}')
for name in "${skips[@]}"; do
  if ! grep -q "^func $name(" "$src"/*_test.go; then
    echo "amqp091-integration: $SKIP_FILE lists $name, which is not in $MODULE@$VERSION" >&2
    exit 1
  fi
done
skip_re="^($(IFS='|'; echo "${skips[*]}"))\$"

# 3. The broker: ours on a port the kernel picks, unless AMQP_URL names one already running.
if [[ -z ${AMQP_URL:-} ]]; then
  if [[ ! -x $BIN ]]; then
    echo "amqp091-integration: no warren binary at $BIN (run make build, or set WARREN_BIN)" >&2
    exit 1
  fi
  mkdir -p "$work/data"
  # The suite's connection-recovery tests find and force-close their connections through the
  # management API, which they expect on localhost:15672 with guest/guest.
  "$BIN" serve --amqp-listen 127.0.0.1:0 --http-listen "$HTTP_LISTEN" --prometheus-listen "" --stream-listen "" --data-dir "$work/data" >"$work/warren.log" 2>&1 &
  warren_pid=$!
  addr=""
  for _ in $(seq 1 150); do
    addr=$(sed -n 's/.*msg="warren started".* amqp=\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/warren.log" | sed -n 1p)
    [[ -n $addr ]] && break
    if ! kill -0 "$warren_pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [[ -z $addr ]]; then
    echo "amqp091-integration: warren did not start; its output:" >&2
    cat "$work/warren.log" >&2
    exit 1
  fi
  AMQP_URL="amqp://guest:guest@$addr/"
  echo "amqp091-integration: warren $("$BIN" version | awk '{print $2}') listening on $addr, HTTP API on $HTTP_LISTEN (pid $warren_pid)"
else
  echo "amqp091-integration: using the broker at $AMQP_URL"
fi

# 4. The suite.
mkdir -p "$LOG_DIR"
log=$LOG_DIR/amqp091-integration.log
echo "amqp091-integration: go test -tags integration $MODULE@$VERSION (${#skips[@]} tests skip-listed); log: $log"
status=0
(
  cd "$src"
  AMQP_URL=$AMQP_URL GOFLAGS="${GOFLAGS:-} -mod=mod" \
    go test -tags integration -count=1 -v -timeout "$SUITE_TIMEOUT" -skip "$skip_re" .
) >"$log" 2>&1 || status=$?

count() { grep -cE "^[[:space:]]*--- $1: " "$log" || true; }
top() { grep -cE "^--- $1: " "$log" || true; }
passed=$(top PASS) failed=$(top FAIL) skipped=$(top SKIP)
echo "amqp091-integration: top-level tests: $passed passed, $failed failed, $skipped skipped by the suite itself, ${#skips[@]} skip-listed"
echo "amqp091-integration: including subtests: $(count PASS) passed, $(count FAIL) failed, $(count SKIP) skipped"

broker_died=0
if [[ -n $warren_pid ]] && ! kill -0 "$warren_pid" 2>/dev/null; then
  echo "amqp091-integration: warren died during the suite; its output (last 50 lines):" >&2
  tail -n 50 "$work/warren.log" >&2
  broker_died=1
fi

if [[ $status -ne 0 || $failed -ne 0 ]]; then
  echo "amqp091-integration: FAILED (go test exit status $status). Failing tests:" >&2
  grep -E "^[[:space:]]*--- FAIL: " "$log" >&2 || true
  echo "--- $log without its === and --- PASS lines (last 150):" >&2
  grep -vE '^[[:space:]]*(=== (RUN|PAUSE|CONT|NAME)|--- PASS)' "$log" | tail -n 150 >&2
  if [[ -n $warren_pid ]]; then
    echo "--- warren output (last 50 lines):" >&2
    tail -n 50 "$work/warren.log" >&2
  fi
  exit 1
fi
if [[ $broker_died -ne 0 ]]; then
  exit 1
fi
if [[ -n $warren_pid ]]; then
  kill -TERM "$warren_pid"
  warren_status=0
  wait "$warren_pid" || warren_status=$?
  warren_pid=""
  if [[ $warren_status -ne 0 ]]; then
    echo "amqp091-integration: warren exited with status $warren_status after SIGTERM; its output:" >&2
    tail -n 50 "$work/warren.log" >&2
    exit 1
  fi
fi
echo "amqp091-integration: PASS"
