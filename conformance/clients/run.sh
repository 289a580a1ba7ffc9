#!/usr/bin/env bash
# Runs the client conformance suites (pika, kombu, amqplib, bunny, php-amqplib), the Celery
# end-to-end test and the stream-protocol suite of rabbitmq-stream-js-client (stream-js) against a
# Warren this script starts, or against the broker at WARREN_URL (and WARREN_STREAM_URL, a
# rabbitmq-stream:// URI of its stream port, for stream-js).
#
#   conformance/clients/run.sh                    # every suite, against bin/warren
#   conformance/clients/run.sh pika celery        # only these suites
#   WARREN_URL=amqp://guest:guest@127.0.0.1:5682/ conformance/clients/run.sh
#                                                 # against a broker already running
#
# For each suite it prints "<suite>: N passed, N failed, N skipped", and writes one line per test,
# "PASS|FAIL|SKIP <suite>/<test>", to $RESULTS_DIR/<suite>.results (differential.sh compares
# these files between brokers). Each suite's full output is in $RESULTS_DIR/<suite>.log.
#
# A suite whose client is not installed is skipped with a message saying what to install, except
# when CI=true: then it counts as a failure. Exit status 0 when no suite failed.
#
# Environment: WARREN_BIN (default bin/warren), WARREN_URL, WARREN_STREAM_URL, RESULTS_DIR (default bin/clients),
# PYTHON (default /usr/bin/python3: Debian's python3-* packages belong to it),
# CLIENT_SUITE_TIMEOUT (seconds per suite, default 300).

# The check_* and run_* functions below are called indirectly, by suite name.
# shellcheck disable=SC2317
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=$ROOT/conformance/clients
BIN=${WARREN_BIN:-$ROOT/bin/warren}
RESULTS_DIR=${RESULTS_DIR:-$ROOT/bin/clients}
PYTHON=${PYTHON:-/usr/bin/python3}
SUITE_TIMEOUT=${CLIENT_SUITE_TIMEOUT:-300}
ALL_SUITES=(pika kombu amqplib bunny php-amqplib celery stream-js)
if [[ $# -gt 0 ]]; then suites=("$@"); else suites=("${ALL_SUITES[@]}"); fi
in_ci() { [[ ${CI:-} == true ]]; }

mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/warren-clients.XXXXXX")
# The run_<suite> functions run in a child bash (under timeout) and read these.
export ROOT DIR PYTHON work
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ in the work tree
warren_pid=""
warren_log=""
STREAM_URL=""

stop_warren() {
  if [[ -n $warren_pid ]] && kill -0 "$warren_pid" 2>/dev/null; then
    kill -TERM "$warren_pid" 2>/dev/null || true
    wait "$warren_pid" 2>/dev/null
    local st=$?
    warren_pid=""
    return $st
  fi
  warren_pid=""
  return 0
}
cleanup() {
  stop_warren >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# start_warren: bin/warren on ports the kernel picks, with a fresh data directory. Sets URL and
# STREAM_URL.
start_warren() {
  local n=$1
  mkdir -p "$work/data$n"
  warren_log=$RESULTS_DIR/warren$n.log
  "$BIN" serve --amqp-listen 127.0.0.1:0 --http-listen "" --prometheus-listen "" --stream-listen 127.0.0.1:0 --data-dir "$work/data$n" >"$warren_log" 2>&1 &
  warren_pid=$!
  local addr=""
  for _ in $(seq 1 150); do
    addr=$(sed -n 's/.*msg="warren started".* amqp=\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$warren_log" | sed -n 1p)
    [[ -n $addr ]] && break
    kill -0 "$warren_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $addr ]]; then
    echo "clients: warren did not start; its output:" >&2
    cat "$warren_log" >&2
    return 1
  fi
  URL="amqp://guest:guest@$addr/"
  local saddr
  saddr=$(sed -n 's/.*msg="stream protocol listener started" addr=\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$warren_log" | sed -n 1p)
  STREAM_URL="rabbitmq-stream://guest:guest@$saddr/%2f"
  echo "clients: warren $("$BIN" version | awk '{print $2}') listening on $addr (pid $warren_pid, log $warren_log)"
}

# check_<suite>: prints the client's version, or fails with what is missing.
py_version() { "$PYTHON" -c "import $1; print('$1', $1.__version__)" 2>/dev/null; }
check_pika() { py_version pika || { echo "Debian package python3-pika (for $PYTHON)"; return 1; }; }
check_kombu() { py_version kombu || { echo "Debian package python3-kombu (for $PYTHON)"; return 1; }; }
check_celery() { py_version celery || { echo "Debian package python3-celery (for $PYTHON)"; return 1; }; }
check_amqplib() {
  command -v node >/dev/null || { echo "node (Debian package nodejs)"; return 1; }
  local pkg=$DIR/node/node_modules/amqplib/package.json
  [[ -f $pkg ]] || { echo "amqplib: run 'npm ci' in conformance/clients/node"; return 1; }
  echo "amqplib $(node -p "require('$pkg').version"), node $(node --version)"
}
check_stream-js() {
  command -v node >/dev/null || { echo "node (Debian package nodejs)"; return 1; }
  local pkg=$DIR/node/node_modules/rabbitmq-stream-js-client/package.json
  [[ -f $pkg ]] || { echo "rabbitmq-stream-js-client: run 'npm ci' in conformance/clients/node"; return 1; }
  [[ -n $STREAM_URL ]] || { echo "a stream port: set WARREN_STREAM_URL to the broker's rabbitmq-stream:// URI"; return 1; }
  echo "rabbitmq-stream-js-client $(node -p "require('$pkg').version"), node $(node --version)"
}
check_bunny() {
  command -v ruby >/dev/null || { echo "ruby (Debian packages ruby-bunny ruby-minitest)"; return 1; }
  ruby -e 'require "bunny"; require "minitest"; puts "bunny #{Bunny::VERSION}, minitest #{Minitest::VERSION}, ruby #{RUBY_VERSION}"' 2>/dev/null ||
    { echo "Debian packages ruby-bunny ruby-minitest"; return 1; }
}
check_php-amqplib() {
  command -v php >/dev/null || { echo "php (Debian packages php-cli php-amqplib phpunit)"; return 1; }
  command -v phpunit >/dev/null || { echo "Debian package phpunit"; return 1; }
  php -r 'require "PhpAmqpLib/autoload.php";' 2>/dev/null || { echo "Debian package php-amqplib"; return 1; }
  echo "php-amqplib $(dpkg-query -W -f '${Version}' php-amqplib 2>/dev/null || echo '?'), $(phpunit --version | grep -o 'PHPUnit [0-9.]*'), php $(php -r 'echo PHP_VERSION;')"
}

# run_<suite> RESULTS_FILE: runs the suite against $URL, its output on stdout.
run_pika() { "$PYTHON" "$DIR/python/runner.py" pika "$DIR/python/pika_test.py" "$1"; }
run_kombu() { "$PYTHON" "$DIR/python/runner.py" kombu "$DIR/python/kombu_test.py" "$1"; }
run_celery() { "$PYTHON" "$DIR/python/runner.py" celery "$ROOT/conformance/celery/test_celery.py" "$1"; }
run_amqplib() {
  cd "$DIR/node" && SUITE_NAME=amqplib node --test \
    --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=./reporter.mjs --test-reporter-destination="$1" test/
}
run_stream-js() {
  cd "$DIR/node" && SUITE_NAME=stream-js node --test \
    --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=./reporter.mjs --test-reporter-destination="$1" stream/
}
run_bunny() { RESULTS_FILE=$1 SUITE_NAME=bunny ruby "$DIR/ruby/bunny_test.rb" -v; }
run_php-amqplib() {
  local junit=$work/php-junit.xml st=0
  rm -f "$junit"
  (cd "$DIR/php" && phpunit --log-junit "$junit") || st=$?
  if [[ -f $junit ]]; then php "$DIR/php/junit2results.php" php-amqplib "$junit" >>"$1"; fi
  return "$st"
}

count() { grep -c "^$1 " "$2" 2>/dev/null || true; }

for suite in "${suites[@]}"; do
  if ! declare -F "run_$suite" >/dev/null; then
    echo "clients: unknown suite '$suite' (known: ${ALL_SUITES[*]})" >&2
    exit 2
  fi
done

status=0
summary=()
total_pass=0 total_fail=0 total_skip=0
if [[ -z ${WARREN_URL:-} ]]; then
  if [[ ! -x $BIN ]]; then
    echo "clients: no warren binary at $BIN (run make build, or set WARREN_BIN)" >&2
    exit 1
  fi
  start_warren 1 || exit 1
  starts=1
else
  URL=$WARREN_URL
  STREAM_URL=${WARREN_STREAM_URL:-}
  echo "clients: using the broker at $URL"
fi

for suite in "${suites[@]}"; do
  results=$RESULTS_DIR/$suite.results
  log=$RESULTS_DIR/$suite.log
  rm -f "$results" "$log"
  : >"$results"
  if ! version=$("check_$suite"); then
    if in_ci; then
      echo "== $suite: FAILED: client missing in CI; install $version"
      echo "FAIL $suite/(client not installed)" >>"$results"
      status=1
    else
      echo "== $suite: SKIPPED: client not installed; install $version"
      echo "SKIP $suite/(client not installed)" >>"$results"
    fi
  else
    echo "== $suite ($version) against $URL (log: $log)"
    start=$SECONDS
    st=0
    (WARREN_URL=$URL WARREN_STREAM_URL=$STREAM_URL timeout --kill-after=10 "$SUITE_TIMEOUT" bash -c "$(declare -f "run_$suite"); run_$suite \"\$1\"" _ "$results") \
      >"$log" 2>&1 </dev/null || st=$?
    if [[ $st -eq 124 || $st -eq 137 ]]; then
      echo "FAIL $suite/(timed out after ${SUITE_TIMEOUT}s)" >>"$results"
    elif [[ $st -ne 0 && $(count FAIL "$results") -eq 0 ]]; then
      echo "FAIL $suite/(suite exited with status $st)" >>"$results"
    elif [[ $(wc -l <"$results") -eq 0 ]]; then
      echo "FAIL $suite/(no test ran)" >>"$results"
    fi
    if [[ -n $warren_pid ]] && ! kill -0 "$warren_pid" 2>/dev/null; then
      echo "FAIL $suite/(warren died during the suite)" >>"$results"
      echo "clients: warren died during $suite; its output (last 50 lines):"
      tail -n 50 "$warren_log"
      starts=$((starts + 1))
      start_warren "$starts" || exit 1
    fi
    if [[ $(count FAIL "$results") -ne 0 ]]; then
      status=1
      echo "-- $suite failed ($((SECONDS - start))s); failing tests:"
      grep '^FAIL ' "$results" | sed 's/^/   /'
      echo "-- $log (last 80 lines):"
      tail -n 80 "$log" | sed 's/^/   | /'
    fi
  fi
  p=$(count PASS "$results") f=$(count FAIL "$results") s=$(count SKIP "$results")
  total_pass=$((total_pass + p)) total_fail=$((total_fail + f)) total_skip=$((total_skip + s))
  line="$suite: $p passed, $f failed, $s skipped"
  summary+=("$line")
  echo "$line"
done

if [[ -n $warren_pid ]]; then
  wst=0
  stop_warren || wst=$?
  if [[ $wst -ne 0 ]]; then
    echo "clients: warren exited with status $wst after SIGTERM; its output (last 50 lines):"
    tail -n 50 "$warren_log"
    status=1
  fi
fi

echo "== client suites against $URL"
printf '%s\n' "${summary[@]}"
echo "clients: $total_pass passed, $total_fail failed, $total_skip skipped"
exit $status
