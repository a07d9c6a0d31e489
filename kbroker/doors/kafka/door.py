"""Assembles the Kafka door of one broker: the API modules over its servicer, served on
its ``kafka.listeners`` (TLS and SASL per listener, with the gRPC listeners' settings)."""

from __future__ import annotations

from kbroker.api.request_budget import RequestPool
from kbroker.config import BrokerConfig
from kbroker.doors.grpc.servicer import BrokerService
from kbroker.doors.kafka.admin_apis import AdminApis
from kbroker.doors.kafka.apis import ApiTable
from kbroker.doors.kafka.group_apis import GroupApis
from kbroker.doors.kafka.log_apis import LogApis
from kbroker.doors.kafka.security_apis import SaslLookup, SecurityApis
from kbroker.doors.kafka.server import KafkaProtocolServer
from kbroker.doors.kafka.tls import listener_contexts, peer_principal
from kbroker.metrics import BrokerMetrics
from kbroker.security.sasl import SaslAuthenticator, SessionStore


def api_table(service: BrokerService, sasl: SaslLookup = lambda listener: None) -> ApiTable:
    """Every API the door serves (ApiVersions lists exactly these)."""
    return ApiTable(
        [
            *LogApis(service.apis).apis(),
            *GroupApis(service.apis.groups, service.apis.offload).apis(),
            *AdminApis(service.apis).apis(),
            *SecurityApis(service, sasl).apis(),
        ]
    )


def kafka_door(
    service: BrokerService,
    *,
    max_request_bytes: int,
    metrics: BrokerMetrics | None,
    config: BrokerConfig | None = None,
    sessions: SessionStore | None = None,
    budget: RequestPool | None = None,
) -> KafkaProtocolServer:
    """The door over ``service``; ``config`` gives the listeners' TLS stores and SASL
    mechanisms (none: plaintext listeners only), ``sessions`` the broker's SASL session
    store (so a credential change seen while an exchange runs refuses it, as on gRPC)."""
    tls = listener_contexts(config.kafka_listeners, config.security_props) if config is not None else {}
    sasl: dict[str, SaslAuthenticator] = {}
    if config is not None:
        store = sessions if sessions is not None else SessionStore(config.connections_max_reauth_ms)
        sasl = {
            e.listener_name: SaslAuthenticator(
                enabled_mechanisms=config.sasl_enabled_mechanisms(e.listener_name),
                lookup=service._credentials.lookup,
                sessions=store,
            )
            for e in config.kafka_listeners
            if e.uses_sasl
        }
    table = api_table(service, sasl.get)
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
