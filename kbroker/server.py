"""The ``kbroker`` process: wires storage, cluster, replication and the gRPC API.

Start-up order: ZooKeeper session -> refuse a live duplicate id -> load logs (recovery)
-> start gRPC -> register ``/brokers/ids/<id>`` -> watch metadata -> join controller
election. SIGTERM/SIGINT shut down cleanly: controlled shutdown (at most
``controlled.shutdown.max.retries`` attempts, ``controlled.shutdown.retry.backoff.ms``
apart), stop serving, resign, deregister, flush and close every log (writing the
clean-shutdown marker). A second SIGTERM or SIGINT during that skips what is left of
the controlled shutdown and the ZooKeeper clean-up; logs are still flushed and closed.

A broker cut off from ZooKeeper and from its followers stops acting as their leader
(:meth:`ReplicaManager.fenced`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import grpc

import kbroker
from kbroker.api.apis import BrokerApis
from kbroker.api.call_context import CallContext, ListenerAuthenticator
from kbroker.api.request_budget import INTER_BROKER_METADATA_KEY, RequestBudgets
from kbroker.cluster.controller import CONTROLLED_SHUTDOWN_ACK_S, Controller, grpc_channel_maker
from kbroker.cluster.group_store import GroupStore
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.txn_store import TransactionStore
from kbroker.cluster.zk_client import BrokerIdInUseError, SessionState, ZkClient
from kbroker.cluster.zkdata import BrokerInfo, CommittedOffset
from kbroker.config import BrokerConfig, add_flags, build_config, flag_settings, load_properties
from kbroker.doors.grpc.server import GrpcServer
from kbroker.doors.grpc.servicer import BrokerService
from kbroker.doors.kafka.door import kafka_door
from kbroker.doors.kafka.server import KafkaProtocolServer
from kbroker.dynamic_config import DynamicBrokerConfig, DynamicConfigApplier
from kbroker.group.coordinator import GroupCoordinator, coordinator_for
from kbroker.log_setup import LoggingConfig, configure
from kbroker.metrics import BrokerMetrics, BrokerState, BrokerStateCollector
from kbroker.replication.fetcher import insecure_channel
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import CredentialStore
from kbroker.security.listeners import EndPoint, with_bound_ports
from kbroker.security.sasl import SaslAuthenticator, SessionStore
from kbroker.security.tls import broker_channel_credentials
from kbroker.security.zk_credential import resolve_credential
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kbroker.txn.coordinator import TransactionCoordinator
from kbroker.txn.housekeeping import TransactionHousekeeping
from kbroker.txn.markers import LeaderMarkerWriter
from kclient.errors import KafkaError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2
from kclient.security import BrokerSession, SecurityConfig, SessionInterceptor, sasl_login
from kclient.transport import CHANNEL_OPTIONS, map_rpc_error

log = logging.getLogger("kbroker")

METADATA_LOAD_WAIT_S = 30.0
"""How long start-up waits for the first read of the cluster's metadata before it says it
is serving (Metadata is refused until then: a client asks another broker)."""


class KafkaServer:
    """One broker."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.static_log_defaults = LogConfig.from_properties(config.log_defaults)
        self.log_defaults = self.static_log_defaults
        """In force: the static defaults with the dynamic broker configs on top."""
        # zookeeper.auth.digest, else KBROKER_ZK_DIGEST, else a JAAS Client section
        credential = resolve_credential(config.zookeeper_auth_digest)
        self.zk = ZkClient(
            config.zookeeper_connect,
            session_timeout_ms=config.zookeeper_session_timeout_ms,
            auth_digest=credential.digest if credential is not None else None,
            set_acl=config.zookeeper_set_acl,
        )
        self.sessions = SessionStore(max_reauth_ms=config.connections_max_reauth_ms)
        """SASL session tokens issued by this broker."""
        # A changed or deleted credential ends the sessions made with the old one; the late
        # notification of a credential's creation ends none.
        self.credentials = CredentialStore(
            self.zk,
            on_user_changed=lambda user: self.sessions.revoke_user(
                user, lambda: self.credentials.credentials(user).values()
            ),
        )
        self.authorizer: AclAuthorizer | None = None
        """kafka.security.authorizer.AclAuthorizer when authorizer.class.name names it."""
        self.dynamic = DynamicBrokerConfig(config, self.zk)
        self.port = -1
        self.cluster_id = ""
        self._registered = threading.Event()
        self._stopped = threading.Event()
        self.hurry = threading.Event()
        """Set by a second SIGTERM/SIGINT: skip what can be skipped of the shutdown."""
        self._grpc: GrpcServer | None = None
        self._kafka: KafkaProtocolServer | None = None
        self.kafka_ports: dict[str, int] = {}
        """Bound port of each Kafka-protocol listener (kafka.listeners)."""
        self.kafka_endpoints: tuple[EndPoint, ...] = ()
        """The advertised Kafka-protocol listeners with their bound ports."""
        self.metrics = BrokerMetrics()
        """This broker's Prometheus registry (served when metrics.port >= 0)."""
        self.zk.time_requests(self.metrics.zookeeper_latency.observe)
        self.metrics_port = -1
        """The bound port of the metrics endpoint, -1 when off."""
        self.logs: LogManager | None = None
        self.broker_epoch = -1

    def startup(self) -> None:
        cfg = self.config
        self.zk.start(timeout_s=cfg.zookeeper_connection_timeout_ms / 1000.0)
        self.zk.ensure_persistent_paths()
        self._wait_for_stale_registration()
        self.cluster_id = self.zk.get_or_create_cluster_id()
        self.credentials.start()
        effective = self.dynamic.load()  # dynamic broker configs apply from boot
        self.log_defaults = LogConfig.from_properties(effective.log_defaults)

        self.logs = LogManager(
            cfg.data_dir,
            self.static_log_defaults,
            retention_check_interval_ms=cfg.retention_check_interval_ms,
            recovery_threads=cfg.num_recovery_threads_per_data_dir,
            cleaner_config=effective.cleaner_config(),
            current_default=self.log_defaults,
        )
        self.logs.startup()
        self.metadata = MetadataCache(self.zk, broker_epoch=lambda: self.broker_epoch)
        self.replicas = ReplicaManager(
            cfg.broker_id,
            self.logs,
            self.log_defaults,
            self.zk,
            self._address_of,
            replica_lag_time_max_ms=cfg.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms=cfg.replica_fetch_wait_max_ms,
            replica_fetch_max_bytes=cfg.replica_fetch_max_bytes,
            inter_broker_channel=self._inter_broker_channel,
        )
        self.replicas.fetch_sessions.configure(
            cfg.max_incremental_fetch_session_cache_slots, cfg.min_incremental_fetch_session_eviction_ms
        )
        self.replicas.set_replication_throttles(
            effective.leader_replication_throttled_rate, effective.follower_replication_throttled_rate
        )
        self.metadata.on_partition_change(self.replicas.on_partition_change)
        self.metadata.on_topic_deleted(self.replicas.on_topic_deleted)
        self.metadata.on_brokers_change(self.replicas.on_brokers_change)
        self.admin = TopicAdmin(
            self.zk,
            default_partitions=cfg.num_partitions,
            default_replication_factor=cfg.default_replication_factor,
            max_partitions_per_topic=cfg.max_partitions_per_topic,
            max_broker_partitions=cfg.max_broker_partitions,
        )
        self.controller = Controller(
            self.zk,
            cfg.broker_id,
            unclean_default=self.log_defaults.unclean_leader_election_enable,
            auto_leader_rebalance=cfg.auto_leader_rebalance,
            leader_imbalance_check_interval_ms=cfg.leader_imbalance_check_interval_ms,
            channel=grpc_channel_maker(self._inter_broker_channel),
        )

        self.groups = GroupCoordinator(
            cfg.broker_id,
            GroupStore(self.zk),
            self.metadata,
            initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=cfg.group_min_session_timeout_ms,
            max_session_timeout_ms=cfg.group_max_session_timeout_ms,
            offsets_retention_minutes=cfg.offsets_retention_minutes,
            offsets_retention_check_interval_ms=cfg.offsets_retention_check_interval_ms,
            inter_broker_channel=self._inter_broker_channel,
        )

        producer_ids = ProducerIdManager(self.zk, cfg.broker_id)
        self.markers = LeaderMarkerWriter(
            cfg.broker_id, self.metadata, self.replicas.write_markers, self._inter_broker_channel
        )
        txn_store = TransactionStore(self.zk)
        self._txn_completions = ThreadPoolExecutor(4, thread_name_prefix="txn-complete")
        self.transactions = TransactionCoordinator(
            txn_store,
            producer_ids,
            self.markers,
            _TransactionalOffsets(self.groups),
            max_timeout_ms=cfg.transaction_max_timeout_ms,
            completions=self._txn_completions.submit,
        )
        self.txn_housekeeping = TransactionHousekeeping(
            self.transactions,
            txn_store,
            lambda tid: coordinator_for(tid, sorted(self.metadata.snapshot().brokers)) == cfg.broker_id,
            interval_ms=cfg.transaction_cleanup_interval_ms,
        )
        sasl = {
            e.listener_name: SaslAuthenticator(
                enabled_mechanisms=cfg.sasl_enabled_mechanisms(e.listener_name),
                lookup=self.credentials.lookup,
                sessions=self.sessions,
            )
            for e in cfg.listeners
            if e.uses_sasl
        }
        if cfg.authorizer_enabled:
            self.authorizer = AclAuthorizer(
                self.zk, super_users=cfg.super_users, allow_everyone_if_no_acl_found=cfg.allow_everyone_if_no_acl_found
            )
            self.authorizer.start()

        services: list[BrokerService] = []

        def servicer(offload: Callable[..., Awaitable[Any]]) -> BrokerService:
            apis = BrokerApis(
                cfg.broker_id,
                lambda: self.cluster_id,
                self.replicas,
                self.metadata,
                self.zk,
                self.admin,
                producer_ids,
                self.controller,
                self.groups,
                offload,
                credentials=self.credentials,
                transactions=self.transactions,
                auto_create_topics=cfg.auto_create_topics,
                authorizer=self.authorizer,
                metrics=self.metrics,
            )
            service = BrokerService(apis, sasl.get)
            services.append(service)
            return service

        self._grpc = GrpcServer(
            servicer,
            [(e, ListenerAuthenticator(e, self.sessions)) for e in cfg.listeners],
            security_props=cfg.security_props,
            workers=cfg.grpc_workers,
            max_request_bytes=cfg.socket_request_max_bytes,
            budgets=RequestBudgets(
                cfg.queued_max_request_bytes,
                cfg.per_connection_request_bytes,
                cfg.inter_broker_queued_max_request_bytes,
            ),
            inter_broker_listener=cfg.inter_broker_listener_name,
            dedicated_inter_broker_listener=cfg.dedicated_inter_broker_listener,
            trusted_broker=self._trusted_broker,
            idle_timeout_ms=cfg.connections_max_idle_ms,
            read_timeout_ms=cfg.request_read_timeout_ms,
            metrics=self.metrics,
        )
        self.ports = self._grpc.start()
        self.port = self.ports[cfg.inter_broker_listener_name]
        self.endpoints = with_bound_ports(cfg.advertised_listeners, self.ports)
        """The advertised listeners with their bound ports (what the broker registers)."""
        self._start_kafka_door(services[0].apis)

        self._register()
        self.zk.add_state_listener(self._session_state)
        self.replicas.start()
        self.metadata.start()
        self.groups.start()
        self.txn_housekeeping.start()
        self.controller.start()
        self.dynamic.on_change(
            DynamicConfigApplier(
                set_log_defaults=self._set_log_defaults,
                set_unclean_default=self.controller.set_unclean_default,
                reconfigure_cleaner=lambda c: self._log_manager().cleaner.reconfigure(c.cleaner_config()),
                set_replication_throttles=self.replicas.set_replication_throttles,
            )
        )
        self.dynamic.start()
        self._serve_metrics(services[0])
        if not self.metadata.wait_loaded(METADATA_LOAD_WAIT_S):  # until then Metadata is refused
            log.warning(
                "broker %d: the cluster's metadata is not read yet after %.0f s; serving, Metadata refused until it is",
                cfg.broker_id,
                METADATA_LOAD_WAIT_S,
            )
        log.info("broker %d started: %s:%d, cluster %s", cfg.broker_id, cfg.advertised, self.port, self.cluster_id)

    def _trusted_broker(self, call: CallContext) -> bool:
        """Whether a gRPC caller may use the inter-broker budget: allowed ClusterAction on
        the cluster (super users are), or anyone without an authorizer (as Kafka trusts a
        replica_id then; docs/grpc-contract.md, "What an unsecured cluster trusts")."""
        authorizer = self.authorizer
        if authorizer is None:
            return True
        return authorizer.authorize(
            call.principal,
            call.client_host,
            AclOperation.CLUSTER_ACTION,
            ResourceType.CLUSTER,
            CLUSTER_NAME,
            log_denied=False,
        )

    def _start_kafka_door(self, core: BrokerApis) -> None:
        """Serve Kafka's binary protocol on ``kafka.listeners`` (none: the door stays shut)."""
        cfg, grpc_server = self.config, self._grpc
        if not cfg.kafka_listeners or grpc_server is None:
            return
        door = kafka_door(
            core,
            max_request_bytes=cfg.socket_request_max_bytes,
            metrics=self.metrics,
            config=cfg,
            sessions=self.sessions,
            budget=grpc_server.budgets.client,
        )
        self._kafka = door
        for e in cfg.kafka_listeners:
            try:
                self.kafka_ports[e.listener_name] = grpc_server.call(door.start(e))
            except OSError as exc:
                raise KafkaError(f"cannot listen on kafka listener {e.connection_string()}: {exc}") from exc
        self.kafka_endpoints = with_bound_ports(cfg.kafka_advertised_listeners, self.kafka_ports)

    def _serve_metrics(self, service: BrokerService) -> None:
        """Register the scrape-time gauges; serve /metrics if metrics.port >= 0."""
        replicas, groups = self.replicas, self.groups
        self.metrics.registry.register(
            BrokerStateCollector(
                BrokerState(
                    partitions=replicas.partitions,
                    min_insync_replicas=lambda topic: replicas.topic_config(topic).min_insync_replicas,
                    controller_active=lambda: self.controller.is_active,
                    offline_partitions=self._offline_partitions,
                    zk_state=lambda: str(self.zk.state),
                    purgatory_sizes=lambda: {**service.apis.log.parked, "Rebalance": groups.waiters.waiting()},
                    committed_offsets=groups.committed_offsets,
                    unfinished_transactions=self.txn_housekeeping.unfinished,
                )
            )
        )
        self.metadata.on_topic_deleted(self.metrics.forget_topic)  # a deleted topic's series go
        if self.config.metrics_port < 0:
            return
        inter = self.config.listener(self.config.inter_broker_listener_name)
        host = inter.bind_host if inter is not None else ""
        self.metrics_port = self.metrics.serve(host, self.config.metrics_port)
        log.info(
            "broker %d metrics: http://%s:%d/metrics", self.config.broker_id, self.config.advertised, self.metrics_port
        )

    def _offline_partitions(self) -> int:
        snap = self.metadata.snapshot()
        return sum(
            1
            for info in snap.topics.values()
            for state in info.states.values()
            if state.leader < 0 or state.leader not in snap.brokers
        )

    def _log_manager(self) -> LogManager:
        if self.logs is None:
            raise RuntimeError("the log manager is not started")
        return self.logs

    def _set_log_defaults(self, defaults: LogConfig) -> None:
        self.log_defaults = defaults
        self._log_manager().set_current_default(defaults)
        self.replicas.update_log_defaults(defaults)

    def _wait_for_stale_registration(self) -> None:
        """Refuse a live duplicate id at once; outwait a dead predecessor's session.

        A broker killed with SIGKILL leaves its ephemeral ``/brokers/ids/<id>`` until its
        ZooKeeper session expires. If the registered address still accepts connections
        the id is live and start-up fails; otherwise wait for the session to expire.
        """
        cfg = self.config
        info = self.zk.broker(cfg.broker_id)
        if info is None:
            return
        try:
            socket.create_connection((info.host, info.port), timeout=1.0).close()
            reachable = True
        except OSError:
            reachable = False
        if not reachable:
            deadline = time.monotonic() + cfg.zookeeper_session_timeout_ms / 1000.0 + 5
            log.info("broker id %d: waiting for a previous session to expire", cfg.broker_id)
            while time.monotonic() < deadline and self.zk.broker_registration_owner(cfg.broker_id) is not None:
                time.sleep(0.2)
        if self.zk.broker_registration_owner(cfg.broker_id) is not None:
            raise BrokerIdInUseError(
                f"broker id {cfg.broker_id} is already registered by a live broker at {info.address}"
            )

    def _inter_broker_channel(self, address: str) -> grpc.Channel:
        """A channel to another broker's inter-broker listener, authenticated as this
        broker: TLS with its own key store as the client certificate on SSL / SASL_SSL, and
        a SASL login (``sasl.mechanism.inter.broker.protocol``, the user of the listener's
        ``sasl.jaas.config``) on SASL_PLAINTEXT / SASL_SSL, whose token every call carries."""
        cfg = self.config
        listener = cfg.listener(cfg.inter_broker_listener_name)
        if listener is None or not listener.uses_tls:
            channel = insecure_channel(address)
        else:
            creds = broker_channel_credentials(cfg.security_props, listener.listener_name)
            channel = grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
        # Its calls are served from the other broker's inter-broker budget.
        channel = grpc.intercept_channel(channel, _InterBrokerMarker(str(cfg.broker_id)))
        login = cfg.inter_broker_sasl_credentials()
        if login is None:
            return channel
        sasl = SecurityConfig(
            security_protocol="SASL_SSL",  # the channel is made above; this names the mechanism and user
            sasl_mechanism=cfg.sasl_mechanism_inter_broker_protocol,
            sasl_plain_username=login[0],
            sasl_plain_password=login[1],
        )
        raw = broker_pb2_grpc.BrokerStub(channel)

        def call(method: str, request: Any) -> Any:
            try:
                return getattr(raw, method)(request, timeout=10.0)
            except grpc.RpcError as exc:
                raise map_rpc_error(exc, address) from None

        session = BrokerSession(address, lambda: sasl_login(call, sasl))
        return grpc.intercept_channel(channel, SessionInterceptor(session))

    def _address_of(self, broker_id: int) -> str | None:
        info = self.metadata.snapshot().brokers.get(broker_id)
        return info.address if info else None

    def _register(self) -> None:
        cfg = self.config
        info = BrokerInfo.of(
            cfg.broker_id, self.endpoints, cfg.inter_broker_listener_name, cfg.rack, self.kafka_endpoints
        )
        self.broker_epoch = self.zk.register_broker(info)
        self._registered.set()

    def _session_state(self, state: str) -> None:
        # kazoo's connection thread: log and hand off only.
        if state == SessionState.SUSPENDED and not self._stopped.is_set():
            log.warning(
                "broker %d: ZooKeeper connection lost; the session expires after %d ms without it",
                self.config.broker_id,
                self.config.zookeeper_session_timeout_ms,
            )
        elif state == SessionState.LOST:
            log.warning(
                "broker %d: ZooKeeper session lost (expired); will re-register when reconnected", self.config.broker_id
            )
            self._registered.clear()
        elif state == SessionState.CONNECTED and not self._stopped.is_set():
            if self._registered.is_set():
                log.info("broker %d: ZooKeeper connection restored (same session)", self.config.broker_id)
            else:
                threading.Thread(target=self._reregister, name="zk-reregister", daemon=True).start()

    def _reregister(self) -> None:
        try:
            self._register()
            log.info("broker %d: re-registered after the session loss (new session)", self.config.broker_id)
        except Exception:
            log.exception("re-registration failed")

    def _controlled_shutdown(self) -> None:
        """Ask the controller to move this broker's leaderships away before it leaves:
        at most ``controlled.shutdown.max.retries`` attempts, ``retry.backoff.ms`` apart."""
        cfg = self.config
        bid = cfg.broker_id
        attempts = cfg.controlled_shutdown_max_retries
        backoff_s = cfg.controlled_shutdown_retry_backoff_ms / 1000.0
        for attempt in range(1, attempts + 1):
            try:
                remaining = self._ask_controller_to_move_leaders(bid)
                if not remaining:
                    log.info("controlled shutdown: leadership moved away")
                    return
                reason = f"still leading {len(remaining)} partition(s)"
            except Exception as exc:
                if isinstance(exc, KafkaError):
                    reason = str(exc)  # names its class already
                else:
                    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.warning("controlled shutdown attempt %d of %d failed: %s", attempt, attempts, reason)
            if attempt < attempts and self.hurry.wait(backoff_s):
                break
        log.warning("controlled shutdown incomplete; shutting down anyway")

    def _ask_controller_to_move_leaders(self, bid: int) -> list[tuple[str, int]]:
        controller = self.metadata.snapshot().controller_id
        if controller == bid:
            return self.controller.controlled_shutdown(bid, self.broker_epoch, timeout_s=self._attempt_timeout_s())
        address = self._address_of(controller)
        if address is None:
            raise KafkaError(f"no live controller (controller id {controller})")
        channel = self._inter_broker_channel(address)
        try:
            resp = broker_pb2_grpc.BrokerStub(channel).ControlledShutdown(
                cluster_pb2.ControlledShutdownRequest(broker_id=bid, broker_epoch=self.broker_epoch),
                timeout=self._attempt_timeout_s(),
            )
        finally:
            channel.close()
        if resp.error_code:
            raise KafkaError(resp.error_message or f"error code {resp.error_code}")
        return [(r.topic, r.partition) for r in resp.remaining]

    def _attempt_timeout_s(self) -> float:
        """One attempt outlasts the controller's wait for the new leaders' answers, so a
        slow but working move is not given up and asked for again."""
        return max(self.config.controlled_shutdown_retry_backoff_ms / 1000.0, CONTROLLED_SHUTDOWN_ACK_S + 5.0)

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        log.info("broker %d shutting down", self.config.broker_id)
        self.dynamic.stop()
        self.credentials.stop()
        if self.authorizer is not None:
            self.authorizer.stop()
        if self.config.controlled_shutdown and not self.hurry.is_set():
            self.replicas.begin_controlled_shutdown()
            self._controlled_shutdown()
        self.txn_housekeeping.stop()
        self._txn_completions.shutdown(wait=False, cancel_futures=True)
        self.groups.shutdown()
        self.markers.close()
        self.metrics.stop_serving()
        if self._grpc is not None:
            if self._kafka is not None:
                try:
                    self._grpc.call(self._kafka.stop(), 5.0)
                except Exception:
                    log.warning("the Kafka-protocol listeners did not stop cleanly", exc_info=True)
            self._grpc.stop(0.0 if self.hurry.is_set() else 2.0)
        zk_up = self.zk.connected and not self.hurry.is_set()
        if not self.zk.connected:
            log.warning("no ZooKeeper connection: skipping the ZooKeeper clean-up (the session ends by itself)")
        try:
            if zk_up:
                self.controller.resign()
            self.controller.stop()
            self.metadata.stop()
            if zk_up:
                self.zk.deregister_broker(self.config.broker_id)
        except Exception:
            log.exception("ZooKeeper clean-up failed")
        self.replicas.shutdown()
        if self.logs is not None:
            self.logs.shutdown()
        try:
            self.zk.close()
        except Exception:
            log.exception("closing the ZooKeeper client failed")
        log.info("broker %d stopped", self.config.broker_id)


class _TransactionalOffsets:
    """The group coordinator as the transaction coordinator's OffsetSink."""

    def __init__(self, groups: GroupCoordinator) -> None:
        self._groups = groups

    def commit(self, group: str, offsets: Mapping[tuple[str, int], CommittedOffset]) -> None:
        self._groups.commit_transactional(group, offsets)


class _InterBrokerMarker(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds ``kbroker-inter-broker: <broker id>`` to every call of an inter-broker channel,
    so the receiving broker serves it from its inter-broker budget. Stateless: thread-safe."""

    def __init__(self, broker_id: str) -> None:
        self._entry = (INTER_BROKER_METADATA_KEY, broker_id)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        marked = _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), self._entry],
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )
        return continuation(marked, request)


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _CallDetails(_Details, grpc.ClientCallDetails):  # type: ignore[misc]
    """One call's details with metadata added (gRPC's own are not copyable)."""


def parse_args(argv: list[str] | None) -> BrokerConfig:
    parser = argparse.ArgumentParser(prog="kbroker", description="Run a kbroker broker.")
    parser.add_argument("config", nargs="?", type=Path, help="server.properties file (Kafka key names)")
    parser.add_argument("--version", action="version", version=f"kbroker {kbroker.version()}")
    add_flags(parser)
    parser.add_argument(
        "--override", "-o", action="append", default=[], metavar="KEY=VALUE", help="any Kafka broker setting"
    )
    args = parser.parse_args(argv)
    props: dict[str, str] = load_properties(args.config) if args.config else {}
    for item in args.override:
        key, sep, value = item.partition("=")
        if not sep:
            raise KafkaError(f"--override expects KEY=VALUE, got {item!r}")
        props[key.strip()] = value.strip()
    props.update(flag_settings(args))
    return build_config(props)


def main(argv: list[str] | None = None) -> int:
    configure(LoggingConfig())  # until the config is read
    try:
        config = parse_args(argv)
        LogConfig.from_properties(config.log_defaults)
        configure(config.logging_config())
    except KafkaError as exc:
        print(f"kbroker: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # log.file cannot be opened
        print(f"kbroker: log.file: {exc}", file=sys.stderr)
        return 2
    server = KafkaServer(config)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        # The first SIGTERM shuts down cleanly; a second one, or any SIGINT, hurries.
        if stop.is_set() or signum == signal.SIGINT:
            server.hurry.set()
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.startup()
    except Exception as exc:
        print(f"kbroker: cannot start broker {config.broker_id}: {exc}", file=sys.stderr)
        try:
            server.zk.close()
        except Exception:
            pass
        if server.logs is not None:
            server.logs.shutdown()
        return 1
    # One write, so that no log line from another thread lands inside it.
    listeners = ",".join(e.connection_string() for e in server.endpoints)
    if server.kafka_endpoints:
        listeners += " kafka " + ",".join(e.connection_string() for e in server.kafka_endpoints)
    sys.stdout.write(f"kbroker {config.broker_id} listening on {config.advertised}:{server.port} {listeners}\n")
    sys.stdout.flush()
    while not stop.wait(1.0):
        pass
    return _shut_down(server)


def _shut_down(server: KafkaServer) -> int:
    """Shut down on a helper thread, so that a second signal is seen at once: then only
    the logs are flushed and closed (at most ``HURRY_S``) before the process exits."""
    worker = threading.Thread(target=server.shutdown, name="shutdown", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        if server.hurry.is_set() and worker.is_alive():
            log.warning("second stop signal: skipping the rest of the shutdown; closing the logs")
            if server.logs is not None:
                server.logs.shutdown()
            worker.join(HURRY_S)
            if worker.is_alive():
                log.warning("shutdown did not finish within %.0f s; exiting now", HURRY_S)
                logging.shutdown()
                os._exit(1)
    return 0


HURRY_S = 5.0


if __name__ == "__main__":
    sys.exit(main())
