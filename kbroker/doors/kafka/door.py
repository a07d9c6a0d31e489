"""Assembles the Kafka door of one broker: the API modules over its core request layer, served on
its ``kafka.listeners`` (TLS and SASL per listener, with the gRPC listeners' settings)."""

from __future__ import annotations

from kbroker.api.apis import BrokerApis
from kbroker.api.request_budget import RequestPool
from kbroker.api.txn_api import TransactionApi
from kbroker.config import BrokerConfig
from kbroker.doors.kafka.admin_apis import AdminApis
from kbroker.doors.kafka.apis import ApiTable
from kbroker.doors.kafka.group_apis import GroupApis
from kbroker.doors.kafka.log_apis import LogApis
from kbroker.doors.kafka.security_apis import SaslLookup, SecurityApis
from kbroker.doors.kafka.server import KafkaProtocolServer
from kbroker.doors.kafka.tls import listener_contexts, peer_principal
from kbroker.doors.kafka.txn_apis import TxnApis
from kbroker.metrics import BrokerMetrics
from kbroker.security.sasl import SaslAuthenticator, SessionStore


def api_table(core: BrokerApis, sasl: SaslLookup = lambda listener: None) -> ApiTable:
    """Every API the door serves (ApiVersions lists exactly these)."""

    def txn() -> TransactionApi:
        return core.transactions

    return ApiTable(
        [
            *LogApis(core).apis(),
            *GroupApis(core.groups, core.offload, txn).apis(),
            *TxnApis(core, txn).apis(),
            *AdminApis(core).apis(),
            *SecurityApis(core, sasl).apis(),
        ]
    )


def kafka_door(
    core: BrokerApis,
    *,
    max_request_bytes: int,
    metrics: BrokerMetrics | None,
    config: BrokerConfig | None = None,
    sessions: SessionStore | None = None,
    budget: RequestPool | None = None,
) -> KafkaProtocolServer:
    """The door over the core; ``config`` gives the listeners' TLS stores and SASL
    mechanisms (none: plaintext listeners only), ``sessions`` the broker's SASL session
    store (so a credential change seen while an exchange runs refuses it, as on gRPC)."""
    tls = listener_contexts(config.kafka_listeners, config.security_props) if config is not None else {}
    sasl: dict[str, SaslAuthenticator] = {}
    if config is not None:
        store = sessions if sessions is not None else SessionStore(config.connections_max_reauth_ms)
        sasl = {
            e.listener_name: SaslAuthenticator(
                enabled_mechanisms=config.sasl_enabled_mechanisms(e.listener_name),
                lookup=core.credentials.lookup,
                sessions=store,
            )
            for e in config.kafka_listeners
            if e.uses_sasl
        }
    table = api_table(core, sasl.get)
    return KafkaProtocolServer(
        table.apis,
        table.unsupported,
        max_request_bytes=max_request_bytes,
        budget=budget,
        idle_timeout_s=config.connections_max_idle_ms / 1000.0 if config is not None else 600.0,
        read_timeout_s=config.request_read_timeout_ms / 1000.0 if config is not None else 30.0,
        ssl_context=lambda e: tls[e.listener_name].context if e.listener_name in tls else None,
        tls_principal=peer_principal,
        metrics=metrics,
    )
