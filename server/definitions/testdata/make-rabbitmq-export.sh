#!/usr/bin/env bash
# Regenerates rabbitmq-3.10.8-export.json and rabbitmq-3.10.8-vhost-export.json from the reference
# RabbitMQ (/work/shared/tools/rabbitmq.sh start; management API on 15682). It creates a vhost
# "wdefs" (and "wdefs-empty"), users "wdefs-*" and a global parameter "wdefs-fixture" with queues
# of all three types, exchanges, bindings, policies, an operator policy, limits and permissions,
# exports the definitions, and deletes everything it created. The only change made to the export
# is that password hashes of users this script did not create are emptied.
set -euo pipefail
MGMT=${RMQ_MGMT:-http://127.0.0.1:15682}
OUT=$(cd "$(dirname "$0")" && pwd)
c() { # method path [body]
  local code
  code=$(curl -s -o /tmp/wdefs-resp -w '%{http_code}' -u guest:guest -H 'content-type: application/json' \
    -X "$1" "$MGMT/api/$2" ${3:+-d "$3"})
  case "$code" in 2*) ;; *) if [ "$1" != DELETE ]; then echo "$1 $2 -> $code: $(cat /tmp/wdefs-resp)" >&2; exit 1; fi ;; esac
}
cleanup() {
  c DELETE vhosts/wdefs; c DELETE vhosts/wdefs-empty
  for u in admin app mon nopass sha512; do c DELETE users/wdefs-$u; done
  c DELETE global-parameters/wdefs-fixture
}
cleanup
trap cleanup EXIT

c PUT vhosts/wdefs '{"description":"Warren definitions fixture","tags":"fixture,warren"}'
c PUT vhosts/wdefs-empty '{}'
c PUT permissions/wdefs/guest '{"configure":".*","write":".*","read":".*"}'

c PUT users/wdefs-admin '{"password":"admin-pass","tags":"administrator"}'
c PUT users/wdefs-app '{"password":"app-pass","tags":""}'
c PUT users/wdefs-mon '{"password":"mon-pass","tags":"monitoring,policymaker"}'
c PUT users/wdefs-nopass '{"password_hash":"","tags":"management"}'
# base64(salt ++ sha512(salt ++ "sha512-pass")) with salt 01020304
H512=$(python3 -c 'import hashlib,base64;s=bytes([1,2,3,4]);print(base64.b64encode(s+hashlib.sha512(s+b"sha512-pass").digest()).decode())')
c PUT users/wdefs-sha512 "{\"password_hash\":\"$H512\",\"hashing_algorithm\":\"rabbit_password_hashing_sha512\",\"tags\":\"\"}"
c PUT user-limits/wdefs-app/max-connections '{"value":10}'
c PUT user-limits/wdefs-app/max-channels '{"value":20}'

c PUT permissions/wdefs/wdefs-admin '{"configure":".*","write":".*","read":".*"}'
c PUT permissions/wdefs/wdefs-app '{"configure":"^app\\.","write":".*","read":".*"}'
c PUT permissions/wdefs/wdefs-mon '{"configure":"","write":"","read":".*"}'
c PUT permissions/wdefs-empty/wdefs-admin '{"configure":".*","write":".*","read":".*"}'
c PUT topic-permissions/wdefs/wdefs-app '{"exchange":"amq.topic","write":"^app\\.","read":".*"}'
c PUT vhost-limits/wdefs/max-queues '{"value":100}'
c PUT vhost-limits/wdefs/max-connections '{"value":50}'
c PUT global-parameters/wdefs-fixture '{"value":{"purpose":"warren definitions fixture"}}'

c PUT policies/wdefs/ttl-dlx '{"pattern":"^app\\.","apply-to":"queues","priority":1,"definition":{"message-ttl":60000,"dead-letter-exchange":"app.dlx","dead-letter-routing-key":"dead"}}'
c PUT policies/wdefs/ha-all '{"pattern":"^(?!amq\\.).*","apply-to":"all","priority":0,"definition":{"ha-mode":"all","ha-sync-mode":"automatic"}}'
c PUT policies/wdefs/limits '{"pattern":"^app\\.limited$","apply-to":"queues","priority":5,"definition":{"max-length":1000,"overflow":"reject-publish","expires":3600000}}'
c PUT policies/wdefs/stream-retention '{"pattern":"^app\\.stream","apply-to":"queues","priority":2,"definition":{"max-age":"7D","stream-max-segment-size-bytes":50000000,"max-length-bytes":1000000000}}'
c PUT policies/wdefs/ae '{"pattern":"^app\\.ex","apply-to":"exchanges","definition":{"alternate-exchange":"app.unrouted"}}'
c PUT policies/wdefs/qq-limit '{"pattern":"^app\\.qq","apply-to":"queues","priority":3,"definition":{"delivery-limit":5,"dead-letter-strategy":"at-least-once","overflow":"reject-publish","queue-leader-locator":"balanced"}}'
c PUT policies/wdefs/lazy '{"pattern":"^lazy\\.","apply-to":"queues","priority":4,"definition":{"queue-mode":"lazy","queue-version":2,"max-in-memory-length":10}}'
c PUT operator-policies/wdefs/op-cap '{"pattern":"^app\\.","apply-to":"queues","priority":0,"definition":{"max-length":100000,"message-ttl":86400000,"expires":604800000,"delivery-limit":10}}'

c PUT queues/wdefs/app.work '{"durable":true,"arguments":{"x-max-priority":10,"x-message-ttl":30000}}'
c PUT queues/wdefs/app.limited '{"durable":true,"arguments":{"x-dead-letter-exchange":"app.dlx","x-max-length":500}}'
c PUT queues/wdefs/app.auto '{"durable":false,"auto_delete":true}'
c PUT queues/wdefs/app.dead '{"durable":true}'
c PUT queues/wdefs/lazy.q '{"durable":true}'
c PUT queues/wdefs/app.qq '{"durable":true,"arguments":{"x-queue-type":"quorum","x-delivery-limit":3,"x-quorum-initial-group-size":1}}'
c PUT queues/wdefs/app.stream '{"durable":true,"arguments":{"x-queue-type":"stream","x-max-age":"1D","x-stream-max-segment-size-bytes":10000000}}'

c PUT exchanges/wdefs/app.dlx '{"type":"fanout","durable":true}'
c PUT exchanges/wdefs/app.direct '{"type":"direct","durable":true,"arguments":{"alternate-exchange":"app.unrouted"}}'
c PUT exchanges/wdefs/app.unrouted '{"type":"fanout","durable":true}'
c PUT exchanges/wdefs/app.topic '{"type":"topic","durable":true}'
c PUT exchanges/wdefs/app.headers '{"type":"headers","durable":true}'
c PUT exchanges/wdefs/app.internal '{"type":"topic","durable":true,"internal":true}'
c PUT exchanges/wdefs/app.ex.ae '{"type":"direct","durable":true}'
c PUT exchanges/wdefs/app.autodel '{"type":"direct","durable":false,"auto_delete":true}'

c POST bindings/wdefs/e/app.dlx/q/app.dead '{"routing_key":""}'
c POST bindings/wdefs/e/app.direct/q/app.work '{"routing_key":"work"}'
c POST bindings/wdefs/e/app.direct/q/app.limited '{"routing_key":"limited","arguments":{"x-arg":"v"}}'
c POST bindings/wdefs/e/app.topic/q/app.work '{"routing_key":"app.#"}'
c POST bindings/wdefs/e/app.headers/q/app.work '{"routing_key":"","arguments":{"x-match":"all","type":"report","format":"pdf"}}'
c POST bindings/wdefs/e/app.topic/e/app.internal '{"routing_key":"internal.*"}'
c POST bindings/wdefs/e/app.unrouted/q/app.dead '{"routing_key":""}'
c POST bindings/wdefs/e/amq.direct/q/app.work '{"routing_key":"amq"}'
c POST bindings/wdefs/e/app.autodel/q/app.qq '{"routing_key":"q"}'
c POST bindings/wdefs/e/app.direct/q/app.stream '{"routing_key":"s"}'

curl -s -u guest:guest "$MGMT/api/definitions" | python3 -c '
import json, sys
d = json.load(sys.stdin)
for u in d["users"]:
    if not u["name"].startswith("wdefs-"):
        u["password_hash"] = ""   # not ours: strip the secret
json.dump(d, sys.stdout, indent=2, sort_keys=False)
print()' > "$OUT/rabbitmq-3.10.8-export.json"
curl -s -u guest:guest "$MGMT/api/definitions/wdefs" | python3 -m json.tool > "$OUT/rabbitmq-3.10.8-vhost-export.json"
echo "wrote $OUT/rabbitmq-3.10.8-export.json and rabbitmq-3.10.8-vhost-export.json"
