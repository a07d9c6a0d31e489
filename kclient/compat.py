"""kafka-python's client settings that mean nothing over gRPC: accepted, named once in
the log, never a crash.

A program written for kafka-python passes settings such as ``api_version``,
``socket_options`` or ``retries``. :func:`check_configs` lets every setting of
kafka-python's ``KafkaProducer`` / ``KafkaConsumer`` / ``KafkaAdminClient`` (2.0.2 to
3.x) through, logs one INFO line per client naming the ones the kclient client does not
use, and refuses, with one line, a name neither kclient nor kafka-python has (a typo) and
the few settings whose silent loss would change what the program does (a custom
``partitioner``, an ``ssl_context``, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kclient.errors import InvalidConfigError

log = logging.getLogger(__name__)

_NETWORK = frozenset(
    {
        "api_version",
        "api_version_auto_timeout_ms",
        "bootstrap_timeout_ms",
        "client_dns_lookup",
        "connections_max_idle_ms",
        "kafka_client",
        "max_in_flight_requests_per_connection",
        "metadata_max_age_ms",
        "metric_group_prefix",
        "metric_reporters",
        "metrics_enabled",
        "metrics_num_samples",
        "metrics_sample_window_ms",
        "proxy_url",
        "receive_buffer_bytes",
        "receive_message_max_bytes",
        "reconnect_backoff_max_ms",
        "reconnect_backoff_ms",
        "request_timeout_ms",
        "retries",
        "retry_backoff_ms",
        "sasl_kerberos_domain_name",
        "sasl_kerberos_name",
        "sasl_kerberos_service_name",
        "sasl_mechanism",
        "sasl_oauth_token_provider",
        "sasl_plain_password",
        "sasl_plain_username",
        "security_protocol",
        "selector",
        "send_buffer_bytes",
        "sock_chunk_buffer_count",
        "sock_chunk_bytes",
        "socket_options",
        "socks5_proxy",
        "ssl_cafile",
        "ssl_certfile",
        "ssl_check_hostname",
        "ssl_ciphers",
        "ssl_context",
        "ssl_crlfile",
        "ssl_keyfile",
        "ssl_password",
        "wakeup_timeout_ms",
        "bootstrap_servers",
        "client_id",
    }
)
"""Settings every kafka-python client has (``retries`` too: Kafka's Java clients have it)."""

KAFKA_PYTHON_CONFIGS: dict[str, frozenset[str]] = {
    "producer": _NETWORK
    | {
        "acks",
        "allow_auto_create_topics",
        "batch_size",
        "buffer_memory",
        "compression_type",
        "delivery_timeout_ms",
        "enable_idempotence",
        "key_serializer",
        "linger_ms",
        "max_block_ms",
        "max_request_size",
        "partitioner",
        "transaction_timeout_ms",
        "transactional_id",
        "value_serializer",
    },
    "consumer": _NETWORK
    | {
        "allow_auto_create_topics",
        "auto_commit_interval_ms",
        "auto_offset_reset",
        "check_crcs",
        "client_rack",
        "consumer_timeout_ms",
        "default_api_timeout_ms",
        "default_offset_commit_callback",
        "enable_auto_commit",
        "enable_incremental_fetch_sessions",
        "exclude_internal_topics",
        "fetch_max_bytes",
        "fetch_max_wait_ms",
        "fetch_min_bytes",
        "group_id",
        "group_instance_id",
        "heartbeat_interval_ms",
        "isolation_level",
        "key_deserializer",
        "legacy_iterator",
        "max_partition_fetch_bytes",
        "max_poll_interval_ms",
        "max_poll_records",
        "partition_assignment_strategy",
        "session_timeout_ms",
        "value_deserializer",
    },
}
"""kafka-python's setting names per client. The admin client takes its own (the network
ones) and, ignored, the producer's and consumer's: tools hand one settings dict to all."""
KAFKA_PYTHON_CONFIGS["admin"] = KAFKA_PYTHON_CONFIGS["producer"] | KAFKA_PYTHON_CONFIGS["consumer"]

_WHY: dict[str, str] = {
    "retries": "failed sends are retried until delivery_timeout_ms",
    "group_instance_id": "no static membership: the member joins as a dynamic one",
    "allow_auto_create_topics": "topics are created by the broker's settings or an admin",
    "check_crcs": "CRCs are always checked",
}
"""Why an ignored setting is harmless, where a word helps."""

_REFUSED: dict[str, str] = {
    "partitioner": "records are partitioned as Kafka's Java client does (murmur2 of the key); "
    "pass partition= to send() to choose",
    "ssl_context": "give ssl_cafile, ssl_certfile and ssl_keyfile instead",
    "ssl_crlfile": "certificate revocation lists are not checked",
    "ssl_ciphers": "gRPC chooses the TLS ciphers",
    "sasl_oauth_token_provider": "sasl_mechanism OAUTHBEARER is not supported",
}
"""Settings kafka-python has whose silent loss would change what a program does: accepted
at their default (None), refused with the reason otherwise."""


def _why(kind: str, key: str) -> str:
    if key == "retries" and kind != "producer":
        return "requests are retried until their timeout"
    return _WHY.get(key, "")


def check_configs(kind: str, configs: Mapping[str, Any], known: Iterable[str]) -> list[str]:
    """Check a ``kind`` client's (``producer``, ``consumer``, ``admin``) keyword settings.

    ``known``: the settings the kclient client acts on. Raises InvalidConfigError for a
    name kafka-python does not have either, or for a :data:`_REFUSED` setting given a
    value; logs one INFO line naming the kafka-python settings that are ignored, and
    returns them (sorted).
    """
    acted_on = set(known)
    theirs = KAFKA_PYTHON_CONFIGS[kind]
    unknown = sorted(k for k in configs if k not in acted_on and k not in theirs)
    if unknown:
        raise InvalidConfigError(
            f"unknown {kind} setting(s): {', '.join(unknown)} (neither kclient nor kafka-python has them)"
        )
    ignored = sorted(k for k in configs if k not in acted_on)
    for key in ignored:
        if key in _REFUSED and configs[key] is not None:
            raise InvalidConfigError(f"{kind} setting {key}={configs[key]!r} is not supported: {_REFUSED[key]}")
    if ignored:
        named = ", ".join(f"{k} ({_why(kind, k)})" if _why(kind, k) else k for k in ignored)
        log.info("%s: %s: no meaning for kbroker; ignored", kind, named)
    return ignored
