#!/usr/bin/env bash
# Starts (or stops) a 3-node RabbitMQ cluster on loopback from Debian's package, as the reference of
# `warren perf cluster --uris`: nodes wr1..wr3@localhost, AMQP ports 5791..5793, Erlang distribution
# ports 25791..25793, no plugins (quorum queues are in the core). Never touches 5672 or the shared
# reference broker (/work/shared/tools/rabbitmq.sh).
#
#   rabbitmq-cluster.sh start   start the three nodes, cluster them, print the AMQP URIs (comma-separated)
#   rabbitmq-cluster.sh stop    stop them and delete their data
set -euo pipefail
BASE=${RMQC_BASE:-/tmp/warren-rabbitmq-cluster}
N=${RMQC_NODES:-3}

env_for() {
  local i=$1
  export RABBITMQ_NODENAME=wr$i@localhost
  export RABBITMQ_NODE_PORT=$((5790 + i))
  export RABBITMQ_DIST_PORT=$((25790 + i))
  export RABBITMQ_MNESIA_BASE=$BASE/wr$i/mnesia
  export RABBITMQ_LOG_BASE=$BASE/wr$i/log
  export RABBITMQ_ENABLED_PLUGINS_FILE=$BASE/wr$i/enabled_plugins
  export RABBITMQ_CONFIG_FILE=$BASE/wr$i/rabbitmq
  export RABBITMQ_PID_FILE=$BASE/wr$i/pid
}

uris() {
  local out=()
  for i in $(seq 1 "$N"); do out+=("amqp://guest:guest@127.0.0.1:$((5790 + i))/"); done
  (IFS=,; echo "${out[*]}")
}

# launch starts the node described by env_for with the open-files limit raised to the hard limit:
# Debian's wrapper runs the node through su, which resets it to 1024, and with a few hundred quorum
# queues RabbitMQ's file handle cache then exceeds its limit and new AMQP connections wait forever
# for a handle (rabbit_networking:setup_socket); the node looks up but refuses every new client.
launch() {
  if [ "$(id -u)" = 0 ] && id rabbitmq >/dev/null 2>&1; then
    su rabbitmq -s /bin/sh -c 'ulimit -n "$(ulimit -Hn)"; cd /var/lib/rabbitmq && /usr/lib/rabbitmq/bin/rabbitmq-server -detached'
  else
    ulimit -n "$(ulimit -Hn)"
    rabbitmq-server -detached
  fi
}

start() {
  for i in $(seq 1 "$N"); do
    mkdir -p "$BASE/wr$i/mnesia" "$BASE/wr$i/log"
    echo '[].' > "$BASE/wr$i/enabled_plugins"
    cat > "$BASE/wr$i/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$((5790 + i))
loopback_users = none
CONF
    if id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq:rabbitmq "$BASE"; fi
    env_for "$i"
    launch
  done
  for i in $(seq 1 "$N"); do
    env_for "$i"
    for _ in $(seq 1 120); do
      if rabbitmqctl -n "wr$i@localhost" await_startup >/dev/null 2>&1; then break; fi
      sleep 1
    done
  done
  for i in $(seq 2 "$N"); do
    env_for "$i"
    rabbitmqctl -n "wr$i@localhost" stop_app >/dev/null
    rabbitmqctl -n "wr$i@localhost" join_cluster wr1@localhost >/dev/null
    rabbitmqctl -n "wr$i@localhost" start_app >/dev/null
  done
  uris
}

stop() {
  for i in $(seq 1 "$N"); do
    env_for "$i"
    rabbitmqctl -n "wr$i@localhost" stop >/dev/null 2>&1 || true
  done
  rm -rf "$BASE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  uris) uris ;;
  *) echo "usage: $0 start|stop|uris" >&2; exit 2 ;;
esac
