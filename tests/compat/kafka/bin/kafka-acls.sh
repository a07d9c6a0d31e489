#!/usr/bin/env bash
# kafka-acls.sh for librdkafka's test suite (KAFKA_PATH=tests/compat/kafka): the same
# arguments, run by `kctl acls`. The tests (0109, 0115, 0119) name the Kafka door with
# --bootstrap-server; kctl's --bootstrap-server is gRPC, so the ACLs are written to
# ZooKeeper instead ($ZK_ADDRESS, which the runner's environment carries), as
# kafka-acls.sh --authorizer-properties zookeeper.connect=... did.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../../.." && pwd)
kctl=${KBROKER_KCTL:-$here/.venv/bin/kctl}
[ -x "$kctl" ] || kctl=kctl
args=()
skip_next=0
for a in "$@"; do
  if [ "$skip_next" = 1 ]; then skip_next=0; continue; fi
  case "$a" in
    --bootstrap-server) skip_next=1 ;;
    --bootstrap-server=*) ;;
    *) args+=("$a") ;;
  esac
done
: "${ZK_ADDRESS:?kafka-acls.sh (kbroker shim): ZK_ADDRESS (ZooKeeper with the cluster chroot) is not set}"
exec "$kctl" acls --zookeeper "$ZK_ADDRESS" "${args[@]}"
