"""Prometheus metrics of one broker, named as the JMX exporter names Kafka's MBeans (so a
Kafka dashboard maps one to one), served over HTTP when ``metrics.port`` >= 0.

Counters and the request histogram are bumped on the hot path (one increment per
partition of a Produce/Fetch, one observe per RPC); everything else is read from the
broker's state at scrape time by :class:`BrokerStateCollector`, so it costs nothing
between scrapes.

Every metric (name, type: meaning):

- ``kafka_server_brokertopicmetrics_messagesin_total{topic}`` counter: records appended
  by Produce on this broker as leader.
- ``kafka_server_brokertopicmetrics_bytesin_total{topic}`` counter: record bytes
  appended by Produce.
- ``kafka_server_brokertopicmetrics_bytesout_total{topic}`` counter: record bytes
  returned to consumers by Fetch.
- ``kafka_server_brokertopicmetrics_replicationbytesout_total{topic}`` counter: record
  bytes returned to follower replicas by Fetch (Kafka's ReplicationBytesOutPerSec).
- ``kafka_network_requestmetrics_requests_total{request}`` counter: RPCs served, by RPC
  name (Produce, Fetch, Metadata, ...).
- ``kafka_network_requestmetrics_errors_total{request,error}`` counter: RPCs that failed
  with a gRPC status (error = the status name, e.g. INVALID_ARGUMENT), and Produce/Fetch
  partitions answered with a Kafka error (error = its Kafka name, e.g.
  NOT_LEADER_FOR_PARTITION).
- ``kafka_network_requestmetrics_totaltimems{request}`` histogram: time of an RPC in the
  broker, milliseconds (``_bucket``, ``_sum``, ``_count``).
- ``kafka_server_zookeeperclientmetrics_zookeeperrequestlatencyms`` histogram: time of
  a ZooKeeper request of this broker, from queued to answered, milliseconds (Kafka's
  ZooKeeperRequestLatencyMs; :mod:`kbroker.cluster.zk_request_timer`).
- ``kafka_server_replicamanager_leadercount`` gauge: partitions led by this broker.
- ``kafka_server_replicamanager_partitioncount`` gauge: partition replicas hosted here.
- ``kafka_server_replicamanager_underreplicatedpartitions`` gauge: led partitions whose
  ISR is smaller than the replica set.
- ``kafka_server_replicamanager_underminisrpartitioncount`` gauge: led partitions whose
  ISR is below the topic's min.insync.replicas.
- ``kafka_server_replicamanager_isrshrinks_total`` / ``..._isrexpands_total`` counter:
  ISR shrinks / expansions this broker made as leader.
- ``kafka_controller_kafkacontroller_activecontrollercount`` gauge: 1 on the active
  controller, else 0 (sum over brokers = 1).
- ``kafka_controller_kafkacontroller_offlinepartitionscount`` gauge: partitions whose
  leader is none or not a live broker; reported by the active controller only (0
  elsewhere, as in Kafka).
- ``kafka_log_log_size{topic,partition}`` gauge: bytes of the partition's log here.
- ``kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation}`` gauge:
  requests waiting now: Produce (acks=all), Fetch (long polls), Rebalance
  (JoinGroup/SyncGroup).
- ``kafka_server_sessionexpirelistener_sessionstate{state}`` gauge: the ZooKeeper session
  state, 1 for the current one of CONNECTED, SUSPENDED, LOST (Kafka's SessionState is a
  string gauge the JMX exporter cannot export).
- ``kafka_consumergroup_lag{consumergroup,topic,partition}`` gauge (kafka-exporter's
  name): high watermark minus committed offset, for every committed partition of every
  group this broker coordinates. The high watermark is this broker's own for the
  partitions it leads and is asked of the leader (ListOffsets) for the others, as
  kafka-exporter does; a partition whose leader does not answer is left out of that
  scrape.

Thread safety: prometheus_client's counters and histograms are thread safe; the
collector only reads.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

_LATENCY_BUCKETS_MS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0)
ZK_STATES = ("CONNECTED", "SUSPENDED", "LOST")
PURGATORIES = ("Produce", "Fetch", "Rebalance")


class RequestMetrics:
    """One RPC's children: bumped once per call by the gRPC guard (no label lookups)."""

    __slots__ = ("_errors", "_request", "requests", "time_ms")

    def __init__(self, metrics: BrokerMetrics, request: str) -> None:
        self._request = request
        self._errors = metrics.errors
        self.requests = metrics.requests.labels(request)
        self.time_ms = metrics.total_time.labels(request)

    def done(self, elapsed_ms: float) -> None:
        self.requests.inc()
        self.time_ms.observe(elapsed_ms)

    def error(self, name: str) -> None:
        self._errors.labels(self._request, name).inc()


class TopicCounters:
    """One topic's traffic counters."""

    __slots__ = ("bytes_in", "bytes_out", "messages_in", "replication_bytes_out")

    def __init__(self, metrics: BrokerMetrics, topic: str) -> None:
        self.messages_in = metrics.messages_in.labels(topic)
        self.bytes_in = metrics.bytes_in.labels(topic)
        self.bytes_out = metrics.bytes_out.labels(topic)
        self.replication_bytes_out = metrics.replication_bytes_out.labels(topic)


class BrokerMetrics:
    """The registry of one broker (never the global one: several brokers may share a
    process in tests) and its hot-path metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages_in = Counter(
            "kafka_server_brokertopicmetrics_messagesin", "Records appended by Produce", ["topic"], registry=r
        )
        self.bytes_in = Counter(
            "kafka_server_brokertopicmetrics_bytesin", "Record bytes appended by Produce", ["topic"], registry=r
        )
        self.bytes_out = Counter(
            "kafka_server_brokertopicmetrics_bytesout", "Record bytes fetched by consumers", ["topic"], registry=r
        )
        self.replication_bytes_out = Counter(
            "kafka_server_brokertopicmetrics_replicationbytesout",
            "Record bytes fetched by follower replicas",
            ["topic"],
            registry=r,
        )
        self.requests = Counter("kafka_network_requestmetrics_requests", "RPCs served", ["request"], registry=r)
        self.errors = Counter(
            "kafka_network_requestmetrics_errors", "RPC or partition errors", ["request", "error"], registry=r
        )
        self.total_time = Histogram(
            "kafka_network_requestmetrics_totaltimems",
            "RPC time in the broker (ms)",
            ["request"],
            buckets=_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.zookeeper_latency = Histogram(
            "kafka_server_zookeeperclientmetrics_zookeeperrequestlatencyms",
            "Time of a ZooKeeper request, from queued to answered (ms)",
            buckets=_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self._topics: dict[str, TopicCounters] = {}
        self._requests: dict[str, RequestMetrics] = {}
        self._http: Any = None

    def topic(self, name: str) -> TopicCounters:
        c = self._topics.get(name)
        if c is None:
            c = self._topics[name] = TopicCounters(self, name)  # a race makes the same children twice
        return c

    def request(self, name: str) -> RequestMetrics:
        m = self._requests.get(name)
        if m is None:
            m = self._requests[name] = RequestMetrics(self, name)
        return m

    def forget_topic(self, name: str) -> None:
        """Drop a deleted topic's series."""
        self._topics.pop(name, None)
        for c in (self.messages_in, self.bytes_in, self.bytes_out, self.replication_bytes_out):
            try:
                c.remove(name)
            except KeyError:
                pass

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0 = a free port); returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_address[1])

    def stop_serving(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


# --- scrape-time gauges ---------------------------------------------------------------


class PartitionLike(Protocol):
    topic: str
    index: int
    broker_id: int
    leader: int
    isr: list[int]
    replicas: list[int]
    high_watermark: int
    isr_shrinks: int
    isr_expands: int

    @property
    def log(self) -> Any: ...

    @property
    def last_stable_offset(self) -> int: ...


@dataclass
class BrokerState:
    """Where the collector reads the broker's state (each a cheap in-memory read)."""

    partitions: Callable[[], Iterable[PartitionLike]]
    min_insync_replicas: Callable[[str], int]
    controller_active: Callable[[], bool]
    offline_partitions: Callable[[], int]
    """Partitions without a live leader (as the cluster metadata says)."""
    zk_state: Callable[[], str]
    purgatory_sizes: Callable[[], Mapping[str, int]]
    committed_offsets: Callable[[], Mapping[str, Mapping[TopicPartition, int]]]
    """Group -> partition -> committed offset, for the groups coordinated here."""
    end_offsets: Callable[[Collection[TopicPartition]], Mapping[TopicPartition, int]] | None = None
    """High watermarks of partitions led elsewhere, asked of their leaders. None: those of
    ``committed_offsets``' owner when it has ``end_offsets`` (the group coordinator)."""
    unfinished_transactions: Callable[[], int] = lambda: 0
    """Transactions coordinated here whose markers wait for a retry."""


class BrokerStateCollector(Collector):  # type: ignore[misc]
    """The gauges, read at scrape time. ISR shrink/expand counts are kept per partition
    (plain ints, bumped under the partition's lock); this sums them into monotonic totals
    (a deleted partition's count is not lost).

    Thread safety: scrapes may run on several HTTP threads at once; ``_lock`` makes one
    scrape at a time update the totals.
    """

    def __init__(self, state: BrokerState) -> None:
        self._state = state
        self._seen: dict[int, tuple[Any, int, int]] = {}  # id(partition) -> (partition, shrinks, expands)
        self._shrinks = 0
        self._expands = 0
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # no describe-time scrape (it would read state at registration)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            metrics = list(self._collect())
        yield from metrics

    def _collect(self) -> Iterator[Metric]:
        s = self._state
        leaders = under_replicated = under_min_isr = hosted = 0
        size = GaugeMetricFamily("kafka_log_log_size", "Bytes of the partition's log", labels=["topic", "partition"])
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "High watermark - committed offset",
            labels=["consumergroup", "topic", "partition"],
        )
        lso_lag = GaugeMetricFamily(
            "kafka_cluster_partition_laststableoffsetlag",
            "High watermark - last stable offset (records of undecided transactions), led partitions",
            labels=["topic", "partition"],
        )
        high_watermarks: dict[TopicPartition, int] = {}
        seen: dict[int, tuple[Any, int, int]] = {}
        for p in s.partitions():
            hosted += 1
            shrinks, expands = p.isr_shrinks, p.isr_expands
            before = self._seen.get(id(p))
            if before is not None and before[0] is p:
                self._shrinks += shrinks - before[1]
                self._expands += expands - before[2]
            else:
                self._shrinks += shrinks
                self._expands += expands
            seen[id(p)] = (p, shrinks, expands)
            try:
                size.add_metric([p.topic, str(p.index)], float(p.log.size_in_bytes))
            except Exception:  # a log being deleted or offline
                pass
            if p.leader != p.broker_id:
                continue
            leaders += 1
            isr = len(p.isr)
            if isr < len(p.replicas):
                under_replicated += 1
            if isr < s.min_insync_replicas(p.topic):
                under_min_isr += 1
            high_watermarks[(p.topic, p.index)] = p.high_watermark
            try:
                lso_lag.add_metric([p.topic, str(p.index)], float(p.high_watermark - p.last_stable_offset))
            except Exception:  # a log being deleted or offline
                pass
        self._seen = seen
        committed = s.committed_offsets()
        missing = {tp for offsets in committed.values() for tp in offsets if tp not in high_watermarks}
        remote = s.end_offsets or getattr(getattr(s.committed_offsets, "__self__", None), "end_offsets", None)
        if missing and remote is not None:
            try:
                high_watermarks.update(remote(missing))
            except Exception:
                log.exception("lag: cannot read the high watermarks of partitions led elsewhere")
        for group, offsets in committed.items():
            for tp, offset in offsets.items():
                hw = high_watermarks.get(tp)
                if hw is not None and offset >= 0:
                    lag.add_metric([group, tp[0], str(tp[1])], float(max(hw - offset, 0)))
        yield _gauge("kafka_server_replicamanager_leadercount", "Partitions led here", leaders)
        yield _gauge("kafka_server_replicamanager_partitioncount", "Partition replicas hosted here", hosted)
        yield _gauge(
            "kafka_server_replicamanager_underreplicatedpartitions",
            "Led partitions whose ISR is smaller than the replica set",
            under_replicated,
        )
        yield _gauge(
            "kafka_server_replicamanager_underminisrpartitioncount",
            "Led partitions whose ISR is below min.insync.replicas",
            under_min_isr,
        )
        yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks", "ISR shrinks", value=self._shrinks)
        yield CounterMetricFamily("kafka_server_replicamanager_isrexpands", "ISR expansions", value=self._expands)
        active = s.controller_active()
        yield _gauge("kafka_controller_kafkacontroller_activecontrollercount", "1 on the active controller", active)
        yield _gauge(
            "kafka_controller_kafkacontroller_offlinepartitionscount",
            "Partitions without a live leader (active controller only)",
            s.offline_partitions() if active else 0,
        )
        yield size
        yield lso_lag
        yield _gauge(
            "kafka_coordinator_transaction_transactionmarkerchannelmanager_logappendretryqueuesize",
            "Transactions coordinated here whose markers wait for a retry (a leader refused or was away)",
            s.unfinished_transactions(),
        )
        purgatory = GaugeMetricFamily(
            "kafka_server_delayedoperationpurgatory_purgatorysize",
            "Requests parked waiting",
            labels=["delayedOperation"],
        )
        sizes = s.purgatory_sizes()
        for kind in PURGATORIES:
            purgatory.add_metric([kind], float(sizes.get(kind, 0)))
        yield purgatory
        zk = GaugeMetricFamily(
            "kafka_server_sessionexpirelistener_sessionstate", "ZooKeeper session state", labels=["state"]
        )
        current = s.zk_state()
        for state in ZK_STATES:
            zk.add_metric([state], 1.0 if state == current else 0.0)
        yield zk
        yield lag


_BATCH_LENGTH = struct.Struct(">i")


def count_records(buf: bytes) -> int:
    """Records in the complete batches of ``buf`` (the recordCount of each batch header)."""
    n, pos, total = len(buf), 0, 0
    unpack = _BATCH_LENGTH.unpack_from
    while n - pos >= 61:
        length = unpack(buf, pos + 8)[0]
        if length < 49:
            break
        total += unpack(buf, pos + 57)[0]
        pos += length + 12
    return total


def error_name(exc: BaseException) -> str:
    """Kafka's name of an error class: NotLeaderForPartitionError -> NOT_LEADER_FOR_PARTITION."""
    name = type(exc).__name__.removesuffix("Error")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))
