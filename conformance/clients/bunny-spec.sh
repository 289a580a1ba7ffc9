#!/usr/bin/env bash
# Runs the Ruby Bunny client's own RSpec suite (ruby-amqp/bunny at tag 2.19.0, the version
# Debian's ruby-bunny ships) against a Warren binary, provisioned the way Bunny's
# bin/ci/before_build.sh provisions RabbitMQ, but through the HTTP API: vhost bunny_testbed,
# users bunny_gem (full permissions) and bunny_reader (read only), guest with permissions there.
#
#   sudo unshare --net conformance/clients/bunny-spec.sh BUNNY_CHECKOUT [WARREN_BIN]
#
# The suite connects to the fixed ports 5672 (AMQP), 5671 (AMQPS) and 15672 (HTTP API), so the
# script must run in a network namespace of its own (`unshare --net`, as root): its loopback is
# private and nothing collides with other brokers on the machine. It needs ruby, ruby-bunny,
# ruby-rspec, curl and openssl; it does not download anything. The AMQPS listener gets a server
# certificate for localhost signed with the checkout's test CA (spec/tls/ca_key.pem).
#
# Run: spec/higher_level_api, spec/lower_level_api and spec/issues, without
# connection_recovery_spec.rb and toxiproxy_spec.rb, which need gems Debian does not ship
# (rabbitmq_http_api_client, toxiproxy). The summary line is RSpec's "N examples, N failures".
set -uo pipefail
SPEC=$(cd "${1:?usage: bunny-spec.sh BUNNY_CHECKOUT [WARREN_BIN]}" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${2:-$ROOT/bin/warren}
work=$(mktemp -d "${TMPDIR:-/tmp}/bunny-spec.XXXXXX")
trap 'kill $warren 2>/dev/null; wait $warren 2>/dev/null; rm -rf "$work"' EXIT

ip link set lo up
cp -r "$SPEC/spec" "$work/spec"
# Bundler is not used: require what Debian ships.
sed -i "s|^require 'bundler'$|require 'rspec'|; s|^Bundler.require(:default, :test)$||" "$work/spec/spec_helper.rb"

openssl req -new -newkey rsa:2048 -nodes -keyout "$work/server_key.pem" -subj "/CN=localhost/O=server" \
  -out "$work/server.csr" 2>/dev/null
printf "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n" >"$work/ext.cnf"
openssl x509 -req -in "$work/server.csr" -CA "$SPEC/spec/tls/ca_certificate.pem" -CAkey "$SPEC/spec/tls/ca_key.pem" \
  -CAcreateserial -CAserial "$work/ca.srl" -days 7 -extfile "$work/ext.cnf" -out "$work/server_certificate.pem" 2>/dev/null

"$BIN" serve --amqp-listen 127.0.0.1:5672 --http-listen 127.0.0.1:15672 --prometheus-listen "" --stream-listen "" --data-dir "$work/data" --log-level warn \
  --amqps-listen 127.0.0.1:5671 --tls-cert "$work/server_certificate.pem" --tls-key "$work/server_key.pem" \
  --tls-ca "$SPEC/spec/tls/ca_certificate.pem" >"$work/warren.log" 2>&1 &
warren=$!
for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/15672) 2>/dev/null && break; sleep 0.1; done

api() {
  curl -s -o /dev/null -w "%{http_code} $1 $2\n" -u guest:guest -X "$1" -H 'content-type: application/json' \
    -d "${3:-}" "http://127.0.0.1:15672/api/$2"
}
api PUT vhosts/bunny_testbed '{}'
api PUT users/bunny_gem '{"password":"bunny_password","tags":""}'
api PUT permissions/bunny_testbed/bunny_gem '{"configure":".*","write":".*","read":".*"}'
api PUT permissions/bunny_testbed/guest '{"configure":".*","write":".*","read":".*"}'
api PUT users/bunny_reader '{"password":"reader_password","tags":""}'
api PUT permissions/bunny_testbed/bunny_reader '{"configure":"^---$","write":"^---$","read":".*"}'

cd "$work" && rspec spec/higher_level_api spec/lower_level_api spec/issues \
  --exclude-pattern "**/{connection_recovery,toxiproxy}_spec.rb" --format progress
