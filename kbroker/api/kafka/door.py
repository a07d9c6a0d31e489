"""Assembles the Kafka door of one broker: the API modules over its servicer, served on
its ``kafka.listeners``."""

from __future__ import annotations

from kbroker.api.broker_service import BrokerService
from kbroker.api.kafka.apis import ApiTable
from kbroker.api.kafka.log_apis import LogApis
from kbroker.api.kafka.server import KafkaProtocolServer
from kbroker.metrics import BrokerMetrics


def api_table(service: BrokerService) -> ApiTable:
    """Every API the door serves (ApiVersions lists exactly these)."""
    return ApiTable([*LogApis(service).apis()])


def kafka_door(service: BrokerService, *, max_request_bytes: int, metrics: BrokerMetrics | None) -> KafkaProtocolServer:
    table = api_table(service)
    return KafkaProtocolServer(table.apis, table.unsupported, max_request_bytes=max_request_bytes, metrics=metrics)
