#!/usr/bin/env bash
# kafka-topics.sh for librdkafka's test suite (KAFKA_PATH=tests/compat/kafka): the same
# arguments, run by kctl. librdkafka's test.c calls it as
#   kafka-topics.sh --zookeeper ZK --create --topic T --partitions N --replication-factor R [--config K=V]...
# (or --bootstrap-server BROKERS for Kafka >= 3.0, which kctl takes as gRPC addresses:
# use --zookeeper). kctl is $KBROKER_KCTL, else the repository's .venv/bin/kctl, else PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../../.." && pwd)
kctl=${KBROKER_KCTL:-$here/.venv/bin/kctl}
[ -x "$kctl" ] || kctl=kctl
verb=""
args=()
for a in "$@"; do
  case "$a" in
    --create|--delete|--list|--describe|--alter) verb=${a#--} ;;
    *) args+=("$a") ;;
  esac
done
if [ -z "$verb" ]; then
  echo "kafka-topics.sh (kbroker shim): one of --create, --delete, --list, --describe, --alter is needed" >&2
  exit 1
fi
exec "$kctl" topics "$verb" "${args[@]}"
