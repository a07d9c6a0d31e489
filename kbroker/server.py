"""The ``kbroker`` process: wires storage, cluster, replication and the gRPC API.

Start-up order: ZooKeeper session -> refuse a live duplicate id -> load logs (recovery)
-> start gRPC -> register ``/brokers/ids/<id>`` -> watch metadata -> join controller
election. SIGTERM/SIGINT shut down cleanly: stop serving, resign, deregister, flush
and close every log (writing the clean-shutdown marker).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
from kazoo.protocol.states import KazooState

from kbroker.api.broker_service import BrokerService
from kbroker.cluster.controller import Controller
from kbroker.cluster.group_store import GroupStore
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import BrokerIdInUseError, ZkClient
from kbroker.cluster.zkdata import BrokerInfo
from kbroker.config import BrokerConfig, build_config, load_properties
from kbroker.group.coordinator import GroupCoordinator
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kclient.errors import KafkaError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2

log = logging.getLogger("kbroker")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 128 * 1024 * 1024),
    ("grpc.max_send_message_length", 128 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


class KafkaServer:
    """One broker."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.log_defaults = LogConfig.from_properties(config.log_defaults)
        self.zk = ZkClient(config.zookeeper_connect, session_timeout_ms=config.zookeeper_session_timeout_ms)
        self.port = -1
        self.cluster_id = ""
        self._registered = threading.Event()
        self._stopped = threading.Event()
        self._grpc: grpc.Server | None = None
        self.logs: LogManager | None = None

    def startup(self) -> None:
        cfg = self.config
        self.zk.start(timeout_s=cfg.zookeeper_connection_timeout_ms / 1000.0)
        self.zk.ensure_persistent_paths()
        self._wait_for_stale_registration()
        self.cluster_id = self.zk.get_or_create_cluster_id()

        self.logs = LogManager(
            cfg.data_dir, self.log_defaults, retention_check_interval_ms=cfg.retention_check_interval_ms
        )
        self.logs.startup()
        self.metadata = MetadataCache(self.zk)
        self.replicas = ReplicaManager(
            cfg.broker_id,
            self.logs,
            self.log_defaults,
            self.zk,
            self._address_of,
            replica_lag_time_max_ms=cfg.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms=cfg.replica_fetch_wait_max_ms,
            replica_fetch_max_bytes=cfg.replica_fetch_max_bytes,
        )
        self.metadata.on_partition_change(self.replicas.on_partition_change)
        self.metadata.on_topic_deleted(self.replicas.on_topic_deleted)
        self.metadata.on_brokers_change(self.replicas.on_brokers_change)
        self.admin = TopicAdmin(
            self.zk,
            default_partitions=cfg.num_partitions,
            default_replication_factor=cfg.default_replication_factor,
        )
        self.controller = Controller(
            self.zk,
            cfg.broker_id,
            unclean_default=self.log_defaults.unclean_leader_election_enable,
            auto_leader_rebalance=cfg.auto_leader_rebalance,
            leader_imbalance_check_interval_ms=cfg.leader_imbalance_check_interval_ms,
        )

        self.groups = GroupCoordinator(
            cfg.broker_id,
            GroupStore(self.zk),
            self.metadata,
            initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=cfg.group_min_session_timeout_ms,
            max_session_timeout_ms=cfg.group_max_session_timeout_ms,
        )

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=cfg.grpc_workers), options=GRPC_OPTIONS)
        broker_pb2_grpc.add_BrokerServicer_to_server(
            BrokerService(
                cfg.broker_id,
                lambda: self.cluster_id,
                self.replicas,
                self.metadata,
                self.zk,
                self.admin,
                ProducerIdManager(self.zk, cfg.broker_id),
                self.controller,
                self.groups,
            ),
            server,
        )
        self.port = server.add_insecure_port(f"{cfg.listen_host}:{cfg.listen_port}")
        if self.port == 0:
            raise KafkaError(f"cannot listen on {cfg.listen_host}:{cfg.listen_port}")
        server.start()
        self._grpc = server

        self._register()
        self.zk.add_state_listener(self._session_state)
        self.replicas.start()
        self.metadata.start()
        self.groups.start()
        self.controller.start()
        log.info("broker %d started: %s:%d, cluster %s", cfg.broker_id, cfg.advertised, self.port, self.cluster_id)

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

    def _address_of(self, broker_id: int) -> str | None:
        info = self.metadata.snapshot().brokers.get(broker_id)
        return info.address if info else None

    def _register(self) -> None:
        cfg = self.config
        info = BrokerInfo(cfg.broker_id, cfg.advertised, self.port, cfg.rack)
        self.zk.register_broker(info)
        self._registered.set()

    def _session_state(self, state: KazooState) -> None:
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost; will re-register when reconnected")
            self._registered.clear()
        elif state == KazooState.CONNECTED and not self._registered.is_set() and not self._stopped.is_set():
            threading.Thread(target=self._reregister, name="zk-reregister", daemon=True).start()

    def _reregister(self) -> None:
        try:
            self._register()
            log.info("re-registered broker %d after session loss", self.config.broker_id)
        except Exception:
            log.exception("re-registration failed")

    def _controlled_shutdown(self, attempts: int = 3) -> None:
        """Ask the controller to move this broker's leaderships away before it leaves."""
        bid = self.config.broker_id
        for attempt in range(attempts):
            controller = self.metadata.snapshot().controller_id
            try:
                if controller == bid:
                    remaining = self.controller.controlled_shutdown(bid)
                else:
                    address = self._address_of(controller)
                    if address is None:
                        raise KafkaError("no controller")
                    channel = grpc.insecure_channel(address)
                    try:
                        resp = broker_pb2_grpc.BrokerStub(channel).ControlledShutdown(
                            cluster_pb2.ControlledShutdownRequest(broker_id=bid), timeout=30
                        )
                    finally:
                        channel.close()
                    if resp.error_code:
                        raise KafkaError(resp.error_message)
                    remaining = [(r.topic, r.partition) for r in resp.remaining]
                if not remaining:
                    log.info("controlled shutdown: leadership moved away")
                    return
                log.warning("controlled shutdown: still leading %d partition(s)", len(remaining))
            except Exception as exc:
                log.warning("controlled shutdown attempt %d failed: %s", attempt + 1, exc)
            time.sleep(0.5)
        log.warning("controlled shutdown incomplete; shutting down anyway")

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        log.info("broker %d shutting down", self.config.broker_id)
        if self.config.controlled_shutdown:
            self._controlled_shutdown()
        self.groups.shutdown()
        if self._grpc is not None:
            self._grpc.stop(grace=2).wait(5)
        try:
            self.controller.resign()
            self.controller.stop()
            self.metadata.stop()
            self.zk.deregister_broker(self.config.broker_id)
        except Exception:
            log.exception("ZooKeeper clean-up failed")
        self.replicas.shutdown()
        if self.logs is not None:
            self.logs.shutdown()
        self.zk.close()
        log.info("broker %d stopped", self.config.broker_id)


def parse_args(argv: list[str] | None) -> BrokerConfig:
    parser = argparse.ArgumentParser(prog="kbroker", description="Run a kbroker broker.")
    parser.add_argument("config", nargs="?", type=Path, help="server.properties file (Kafka key names)")
    parser.add_argument("--broker-id", type=int)
    parser.add_argument("--zookeeper", help="HOST:PORT[,HOST:PORT...][/chroot]")
    parser.add_argument("--listen", help="HOST:PORT to serve gRPC on (port 0 picks a free one)")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--rack")
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
    for flag, key in (
        (args.broker_id, "broker.id"),
        (args.zookeeper, "zookeeper.connect"),
        (args.listen, "listen"),
        (args.data_dir, "log.dirs"),
        (args.rack, "broker.rack"),
    ):
        if flag is not None:
            props[key] = str(flag)
    return build_config(props)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        config = parse_args(argv)
        LogConfig.from_properties(config.log_defaults)
    except KafkaError as exc:
        print(f"kbroker: {exc}", file=sys.stderr)
        return 2
    server = KafkaServer(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
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
    print(f"kbroker {config.broker_id} listening on {config.advertised}:{server.port}", flush=True)
    while not stop.wait(1.0):
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
