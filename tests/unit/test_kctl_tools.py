"""The pure parts of kctl's operator tools: parsers, formatting, CSV plans, the default
connection, dump-log over real segment files, and the top view's arithmetic."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from kbroker.cli import dump_log, groups, leaders, main, top, topics
from kbroker.cli.backends import PartitionView, TopicView
from kbroker.cli.common import CliError, UsageError, default_connection
from kbroker.cli.console import LineFormat, producer_config
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient import TopicPartition
from kclient.admin import GroupDescription, MemberDescription
from kclient.errors import ElectionNotNeededError, PreferredLeaderNotAvailableError
from kclient.records import encode_batch

# --- groups reset-offsets: --by-duration, --export / --from-file -------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("P1D", 86_400_000),
        ("PT2H30M", 9_000_000),
        ("PT0.5S", 500),
        ("P1DT1S", 86_401_000),
        ("pt15m", 900_000),
        ("PT1,25S", 1250),
        ("P0D", 0),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert groups.parse_duration(text) == ms


@pytest.mark.parametrize("text", ["P", "PT", "1D", "P1H", "PT1D", "P-1D", "yesterday", "P1DT"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--by-duration"):
        groups.parse_duration(text)


def test_export_and_read_back_one_group() -> None:
    plan = {"g": {TopicPartition("t", 1): 7, TopicPartition("t", 0): 5, TopicPartition("a", 0): 0}}
    lines = groups.export_lines(plan)
    assert lines == ["a,0,0", "t,0,5", "t,1,7"]
    rows, width = groups.read_plan("\n".join(lines) + "\n\n", "f")
    assert width == 3
    assert {tp: o for g, tp, o in rows if g is None} == plan["g"]


def test_export_several_groups_has_a_group_column() -> None:
    plans = {"h": {TopicPartition("t", 0): 1}, "g": {TopicPartition("t", 0): 2}}
    assert groups.export_lines(plans) == ["g,t,0,2", "h,t,0,1"]
    rows, width = groups.read_plan("g,t,0,2\nh,t,0,1\n", "f")
    assert width == 4
    assert rows == [("g", TopicPartition("t", 0), 2), ("h", TopicPartition("t", 0), 1)]


@pytest.mark.parametrize("text", ["", "t,0\n", "t,x,1\n", "t,0,-1\n", "t,0,1\ng,t,0,1\n", ",0,1\n", "a,b,c,d,e\n"])
def test_read_plan_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--from-file f"):
        groups.read_plan(text, "--from-file f")


def test_plan_table() -> None:
    lines = groups.plan_table({"g": {TopicPartition("t", 0): 12}})
    assert [line.split() for line in lines] == [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], ["g", "t", "0", "12"]]


# --- groups describe --members / --state ---------------------------------------------------


def _group(members: list[MemberDescription], state: str = "Stable") -> GroupDescription:
    return GroupDescription("g", state, "consumer", "range", 3, members)


def test_members_view_and_assignments() -> None:
    a = MemberDescription("m-1", "c1", "ipv4:10.0.0.1:5000", [TopicPartition("t", 1), TopicPartition("t", 0)])
    b = MemberDescription("m-2", "c2", "ipv4:10.0.0.2:5000", [TopicPartition("u", 2), TopicPartition("t", 2)])
    idle = MemberDescription("m-3", "", "ipv6:[::1]:5000", [])
    lines = groups.members_lines(_group([b, a, idle]))
    assert [line.split() for line in lines] == [
        ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"],
        ["g", "m-1", "/10.0.0.1", "c1", "2"],
        ["g", "m-2", "/10.0.0.2", "c2", "2"],
        ["g", "m-3", "/::1", "-", "0"],
    ]
    verbose = groups.members_lines(_group([b, a, idle]), verbose=True)
    assert verbose[0].split()[-1] == "ASSIGNMENT"
    assert [line.split()[-1] for line in verbose[1:]] == ["t(0,1)", "t(2),u(2)", "-"]
    assert groups.members_lines(_group([], "Empty")) == ["Consumer group 'g' has no active members."]


def test_state_view() -> None:
    member = MemberDescription("m-1", "c1", "ipv4:10.0.0.1:5000", [])
    lines = groups.state_lines(_group([member]), "127.0.0.1:9092  (0)")
    assert lines[0] == "GROUP COORDINATOR (ID)    ASSIGNMENT-STRATEGY STATE  #MEMBERS"
    assert lines[1] == "g     127.0.0.1:9092  (0) range               Stable 1"
    empty = groups.state_lines(GroupDescription("g", "Empty", "consumer", "", 0, []), "-")
    assert empty[1].split() == ["g", "-", "-", "Empty", "0"]


# --- leaders elect ---------------------------------------------------------------------------


def test_election_report_separates_elected_from_already_elected() -> None:
    results: dict[tuple[str, int], Exception | None] = {
        ("t", 0): None,
        ("t", 1): None,
        ("t", 2): ElectionNotNeededError("not needed"),
        ("t", 3): PreferredLeaderNotAvailableError("t-3: preferred replica 2 is not alive"),
    }
    lines = leaders.result_lines(results, unchanged={("t", 1)})
    assert lines[:2] == [
        "Successfully completed leader election (PREFERRED) for partitions t-0",
        "Valid replica already elected for partitions t-1, t-2",
    ]
    assert lines[2] == (
        "Error completing leader election (PREFERRED) for partition: t-3: "
        "PreferredLeaderNotAvailableError: t-3: preferred replica 2 is not alive"
    )
    assert leaders.result_lines({("t", 0): None}, {("t", 0)}) == ["Valid replica already elected for partitions t-0"]


def test_already_preferred() -> None:
    t = TopicView("t", [PartitionView(0, 1, [1, 2], [1, 2]), PartitionView(1, 1, [2, 1], [1, 2])])
    assert leaders.already_preferred([t]) == {("t", 0)}


# --- topics describe -------------------------------------------------------------------------


def _topics() -> list[TopicView]:
    a = TopicView(
        "a",
        [
            PartitionView(0, 0, [0, 1, 2], [0, 1, 2]),
            PartitionView(1, 1, [1, 2, 0], [1, 2]),
            PartitionView(2, 2, [2, 0, 1], [2]),
            PartitionView(3, -1, [0, 1, 2], [0, 1]),
        ],
        {"min.insync.replicas": "2"},
        topic_id="AbCdEfGhIjKlMnOpQrStUv",
    )
    b = TopicView("b", [PartitionView(0, 0, [0], [0])])
    return [a, b]


def test_topic_id_in_the_topic_line() -> None:
    lines = topics.describe_lines(_topics())
    assert lines[0] == (
        "Topic: a\tTopicId: AbCdEfGhIjKlMnOpQrStUv\tPartitionCount: 4\tReplicationFactor: 3\t"
        "Configs: min.insync.replicas=2"
    )
    assert lines[5] == "Topic: b\tPartitionCount: 1\tReplicationFactor: 1\tConfigs: "


def test_min_isr_filters() -> None:
    min_isr = {"a": 2, "b": 1}
    under = topics.describe_lines(_topics(), under_min_isr=True, min_isr=min_isr)
    assert [line.split("\t")[2] for line in under] == ["Partition: 2", "Partition: 3"]
    at = topics.describe_lines(_topics(), at_min_isr=True, min_isr=min_isr)
    assert [(line.split("\t")[1], line.split("\t")[2]) for line in at] == [
        ("Topic: a", "Partition: 1"),
        ("Topic: a", "Partition: 3"),
        ("Topic: b", "Partition: 0"),
    ]


def test_topics_with_overrides() -> None:
    lines = topics.describe_lines(_topics(), with_overrides=True)
    assert len(lines) == 1 and lines[0].startswith("Topic: a\t")


# --- produce --property / --producer-property ---------------------------------------------


def test_line_format_defaults_are_kafkas() -> None:
    fmt = LineFormat.from_properties({"parse.headers": "true", "parse.key": "true"})
    assert fmt.parse(b"h1:v1,h2:v2\tk\tvalue", 1) == (b"k", b"value", [("h1", b"v1"), ("h2", b"v2")])
    assert fmt.parse(b"\tk\tvalue", 2) == (b"k", b"value", [])
    assert fmt.parse(b"h:\tk\tv", 3) == (b"k", b"v", [("h", b"")])


def test_line_format_custom_separators() -> None:
    props = {
        "parse.headers": "true",
        "headers.delimiter": "|",
        "headers.separator": ";",
        "headers.key.separator": "=",
        "key.separator": "::",
    }
    fmt = LineFormat.from_properties(props)
    assert fmt.parse(b"a=1;b=2|key::v:a:l", 1) == (b"key", b"v:a:l", [("a", b"1"), ("b", b"2")])
    assert LineFormat.from_properties({}).parse(b"k\tv", 1) == (b"k", b"v", [])


def test_line_format_errors() -> None:
    fmt = LineFormat.from_properties({"parse.headers": "true"})
    with pytest.raises(CliError, match="No headers delimiter found on line number 4"):
        fmt.parse(b"no tab here", 4)
    with pytest.raises(CliError, match="No header key separator found in pair 'bad' on line number 1"):
        fmt.parse(b"bad\tv", 1)
    lenient = LineFormat.from_properties({"parse.headers": "true", "ignore.error": "true"})
    assert lenient.parse(b"bad\tv", 1) == (None, b"v", [("bad", None)])
    assert lenient.parse(b"whole line", 1) == (None, b"whole line", [])
    with pytest.raises(UsageError, match="unknown --property for produce: nope"):
        LineFormat.from_properties({"nope": "1"})
    with pytest.raises(UsageError, match=r"headers\.separator must not be empty"):
        LineFormat.from_properties({"headers.separator": ""})


def _produce_args(*props: str, **flags: object) -> argparse.Namespace:
    values: dict[str, object] = {"acks": None, "compression_type": None, "max_block_ms": None, "command_config": None}
    values.update(flags)
    return argparse.Namespace(producer_property=list(props), **values)


def test_producer_property_java_and_python_names() -> None:
    config = producer_config(_produce_args("linger.ms=7", "batch_size=1024", "acks=1"))
    assert config["linger_ms"] == 7 and config["batch_size"] == 1024 and config["acks"] == "1"
    assert config["compression_type"] == "none" and config["max_block_ms"] == 60000
    explicit = producer_config(_produce_args("acks=1", "compression.type=gzip", acks="all"))
    assert explicit["acks"] == "all" and explicit["compression_type"] == "gzip"  # the flag wins
    with pytest.raises(UsageError, match=r"unknown --producer-property setting 'nope\.ms'"):
        producer_config(_produce_args("nope.ms=1"))
    with pytest.raises(UsageError, match="must be a number"):
        producer_config(_produce_args("linger.ms=soon"))


# --- the default connection ------------------------------------------------------------------


def _write_state(folder: Path, pid: int | None = None, **extra: object) -> Path:
    state = {
        "zookeeper": {"pid": os.getpid() if pid is None else pid, "connect": "127.0.0.1:2181/kbroker"},
        "bootstrap": "127.0.0.1:9092",
        **extra,
    }
    (folder / ".run").mkdir(parents=True, exist_ok=True)
    path = folder / ".run" / "cluster.json"
    path.write_text(json.dumps(state))
    return path


def test_default_connection_from_cluster_json(tmp_path: Path) -> None:
    path = _write_state(tmp_path, command_config="/x/admin.properties")
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    found = default_connection({}, sub)
    assert found is not None
    assert (found.bootstrap, found.zookeeper, found.command_config) == (
        "127.0.0.1:9092",
        "127.0.0.1:2181/kbroker",
        "/x/admin.properties",
    )
    assert found.source == str(path.resolve())


def test_default_connection_env_wins(tmp_path: Path) -> None:
    _write_state(tmp_path, command_config="/x/admin.properties")
    found = default_connection({"KBROKER_BOOTSTRAP": "10.0.0.1:9092"}, tmp_path)
    assert found is not None
    assert (found.bootstrap, found.zookeeper, found.command_config, found.source) == (
        "10.0.0.1:9092",
        None,
        None,
        "$KBROKER_BOOTSTRAP",
    )
    same = default_connection({"KBROKER_BOOTSTRAP": "127.0.0.1:9092"}, tmp_path)
    assert same is not None and same.command_config == "/x/admin.properties"


def test_no_default_connection(tmp_path: Path) -> None:
    assert default_connection({}, tmp_path) is None
    dead = 2**22 + 12345  # beyond pid_max's default: no such process
    _write_state(tmp_path, pid=dead)
    assert default_connection({}, tmp_path) is None  # a stopped cluster's stale file
    (tmp_path / ".run" / "cluster.json").write_text("{not json")
    assert default_connection({}, tmp_path) is None


def test_apply_default_connection(tmp_path: Path) -> None:
    _write_state(tmp_path, command_config="/x/admin.properties")
    found = default_connection({}, tmp_path)
    parser = main.build_parser()

    args = parser.parse_args(["topics", "list"])
    note = main.apply_default_connection(args, found)
    assert args.bootstrap_server == "127.0.0.1:9092" and args.zookeeper is None
    assert args.command_config == "/x/admin.properties"
    assert note is not None and "--bootstrap-server 127.0.0.1:9092 from" in note

    given = parser.parse_args(["topics", "list", "--zookeeper", "zk:1"])
    assert main.apply_default_connection(given, found) is None and given.bootstrap_server is None

    zk_only = parser.parse_args(["zookeeper-security-migration", "--zookeeper.acl", "secure"])
    main.apply_default_connection(zk_only, found)
    assert zk_only.zookeeper == "127.0.0.1:2181/kbroker" and zk_only.bootstrap_server is None

    local = parser.parse_args(["dump-log", "--files", "x.log"])
    assert main.apply_default_connection(local, found) is None


# --- dump-log --------------------------------------------------------------------------------


def _segments(tmp_path: Path) -> Path:
    log = Log.open(tmp_path / "t-0", LogConfig(index_interval_bytes=1))
    try:
        log.append_as_leader(
            encode_batch([b"hello", b"world"], keys=[b"k", None], headers=[[("h", b"1")], []], base_timestamp=1_000),
            leader_epoch=3,
        )
        log.append_as_leader(encode_batch([b"again"], base_timestamp=2_000), leader_epoch=3)
        log.flush()
    finally:
        log.close()
    return tmp_path / "t-0"


def test_dump_log_batches_and_records(tmp_path: Path) -> None:
    folder = _segments(tmp_path)
    path = folder / "00000000000000000000.log"
    shallow = dump_log.dump_file(path)
    assert shallow[:2] == [f"Dumping {path}", "Starting offset: 0"]
    assert len(shallow) == 4
    first = shallow[2]
    assert first.startswith(
        "baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
        "partitionLeaderEpoch: 3 isTransactional: false isControl: false position: 0 CreateTime: 1000 size: "
    ), first
    assert first.endswith(" magic: 2 compresscodec: NONE crc: " + first.split("crc: ")[1].split()[0] + " isvalid: true")
    size = int(first.split("size: ")[1].split()[0])
    assert shallow[3].startswith("baseOffset: 2 lastOffset: 2 count: 1 ") and f"position: {size} " in shallow[3]

    deep = dump_log.dump_file(path, deep=True)
    assert deep[3] == "| offset: 0 CreateTime: 1000 keySize: 1 valueSize: 5 sequence: -1 headerKeys: [h]"
    assert deep[4] == "| offset: 1 CreateTime: 1000 keySize: -1 valueSize: 5 sequence: -1 headerKeys: []"
    data = dump_log.dump_file(path, print_data=True)
    assert data[3].endswith("headerKeys: [h] key: k payload: hello")
    assert data[4].endswith("headerKeys: [] payload: world")
    assert data[6].endswith("payload: again")


def test_dump_log_torn_tail_and_indexes(tmp_path: Path) -> None:
    folder = _segments(tmp_path)
    path = folder / "00000000000000000000.log"
    with path.open("ab") as f:
        f.write(b"\x00" * 7)
    lines = dump_log.dump_file(path)
    assert lines[-1] == f"Found 7 invalid bytes at the end of {path.name}"

    index = dump_log.dump_file(folder / "00000000000000000000.index")
    assert index[0].startswith("Dumping ")
    assert index[1:] and all(line.startswith("offset: ") and " position: " in line for line in index[1:])
    assert index[1] in ("offset: 1 position: 0", "offset: 2 position: " + lines[3].split("position: ")[1].split()[0])
    times = dump_log.dump_file(folder / "00000000000000000000.timeindex")
    assert all(line.startswith("timestamp: ") for line in times[1:])

    assert dump_log.dump_file(tmp_path / "notes.txt") == [f"Ignoring unknown file {tmp_path / 'notes.txt'}"]


def test_dump_log_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _segments(tmp_path)
    files = f"{folder / '00000000000000000000.log'},{folder / '00000000000000000000.index'}"
    assert main.main(["dump-log", "--files", files, "--print-data-log"]) == 0
    out = capsys.readouterr().out
    assert out.count("Dumping ") == 2 and "payload: hello" in out
    assert main.main(["dump-log", "--files", str(tmp_path / "missing.log")]) == 1
    assert capsys.readouterr().err.startswith("kctl: ")


# --- top -------------------------------------------------------------------------------------


def test_topic_rates_and_lag() -> None:
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    parts = [top.PartitionRow("t", 0, 0, [0], [0]), top.PartitionRow("t", 1, 0, [0], [0])]
    before = top.Snapshot(at=10.0, partitions=parts, log_ends={t0: 100, t1: 50})
    after = top.Snapshot(at=12.0, partitions=parts, log_ends={t0: 130, t1: 60})
    assert top.topic_rates(None, after) == {"t": None}
    assert top.topic_rates(before, after) == {"t": 20.0}
    assert top.group_lag({t0: 120, t1: -1}, after.log_ends) == 10
    assert top.group_lag({}, after.log_ends) is None


def test_top_frame_renders() -> None:
    pytest.importorskip("rich")
    from rich.console import Console

    snap = top.Snapshot(
        at=1.0,
        brokers=[top.BrokerRow(0, "127.0.0.1:9092", "r1"), top.BrokerRow(1, "127.0.0.1:9093", None)],
        controller=1,
        partitions=[top.PartitionRow("t", 0, 0, [0, 1], [0]), top.PartitionRow("t", 1, -1, [1, 0], [])],
        log_ends={TopicPartition("t", 0): 42},
        groups=[top.GroupRow("g", "Stable", 2, 5)],
    )
    console = Console(width=160, record=True)
    console.print(top.render(snap, {"t": 3.5}, "127.0.0.1:9092"))
    text = console.export_text()
    assert "controller: 1" in text and "127.0.0.1:9093" in text
    assert "3.5" in text and "t-1" in text and "none" in text and "Stable" in text
