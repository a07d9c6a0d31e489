"""Partition assignors: classic cases with exact outputs, and properties over random inputs."""

from __future__ import annotations

import random

import pytest

from kclient.assignors import (
    AbstractPartitionAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    resolve_assignors,
)
from kclient.errors import InvalidConfigError
from kclient.structs import TopicPartition as TP

ALL = [RangeAssignor(), RoundRobinAssignor(), StickyAssignor()]


def tps(spec: str) -> list[TP]:
    """'t0:0,1 t1:2' -> [TP('t0', 0), TP('t0', 1), TP('t1', 2)]."""
    out: list[TP] = []
    for part in spec.split():
        topic, _, ps = part.partition(":")
        out.extend(TP(topic, int(p)) for p in ps.split(",") if p)
    return sorted(out)


def subs(topics: list[str], *members: str) -> dict[str, Subscription]:
    return {m: Subscription(list(topics)) for m in members}


# --- payloads -----------------------------------------------------------------------


def test_subscription_round_trip() -> None:
    sub = Subscription(["b", "a"], [TP("a", 1), TP("b", 0), TP("a", 0)], 7, b"x")
    back = decode_subscription(encode_subscription(sub))
    assert back == Subscription(["a", "b"], [TP("a", 0), TP("a", 1), TP("b", 0)], 7, b"x")


def test_assignment_round_trip() -> None:
    parts = [TP("t", 3), TP("s", 0), TP("t", 1)]
    assert decode_assignment(encode_assignment(parts)) == [TP("s", 0), TP("t", 1), TP("t", 3)]
    assert decode_assignment(b"") == []


def test_resolve_assignors_accepts_names_classes_and_instances() -> None:
    sticky = StickyAssignor()
    got = resolve_assignors(["roundrobin", RangeAssignor, sticky])
    assert [a.name for a in got] == ["roundrobin", "range", "sticky"]
    assert got[2] is sticky
    assert [a.name for a in resolve_assignors("range")] == ["range"]
    with pytest.raises(InvalidConfigError, match="unknown partition assignment strategy"):
        resolve_assignors(["nope"])
    with pytest.raises(InvalidConfigError, match="listed twice"):
        resolve_assignors(["range", RangeAssignor])
    with pytest.raises(InvalidConfigError, match="empty"):
        resolve_assignors([])


# --- classic cases (the examples of Kafka's javadoc) ---------------------------------


def test_range_classic() -> None:
    got = RangeAssignor().assign({"t0": 3, "t1": 3}, subs(["t0", "t1"], "C0", "C1"))
    assert got == {"C0": tps("t0:0,1 t1:0,1"), "C1": tps("t0:2 t1:2")}


def test_range_first_members_get_the_extras() -> None:
    got = RangeAssignor().assign({"t": 10}, subs(["t"], "c", "a", "b"))
    assert got == {"a": tps("t:0,1,2,3"), "b": tps("t:4,5,6"), "c": tps("t:7,8,9")}


def test_range_per_topic_only_subscribers() -> None:
    s = {"A": Subscription(["x"]), "B": Subscription(["x", "y"])}
    got = RangeAssignor().assign({"x": 3, "y": 2}, s)
    assert got == {"A": tps("x:0,1"), "B": tps("x:2 y:0,1")}


def test_roundrobin_classic() -> None:
    got = RoundRobinAssignor().assign({"t0": 3, "t1": 3}, subs(["t0", "t1"], "C0", "C1"))
    assert got == {"C0": tps("t0:0,2 t1:1"), "C1": tps("t0:1 t1:0,2")}


def test_roundrobin_skips_members_not_subscribed() -> None:
    s = {"C0": Subscription(["t0"]), "C1": Subscription(["t0", "t1"]), "C2": Subscription(["t0", "t1", "t2"])}
    got = RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, s)
    assert got == {"C0": tps("t0:0"), "C1": tps("t1:0"), "C2": tps("t1:1 t2:0,1,2")}


def test_sticky_fresh_group_is_balanced() -> None:
    got = StickyAssignor().assign({"t": 4}, subs(["t"], "a", "b", "c"))
    assert sorted(len(v) for v in got.values()) == [1, 1, 2]
    assert sorted(tp for v in got.values() for tp in v) == tps("t:0,1,2,3")


def test_sticky_classic_member_leaves() -> None:
    # Kafka's StickyAssignor javadoc: C1 leaves; C0 and C2 keep all they had.
    topics = ["t0", "t1", "t2", "t3"]
    before = {
        "C0": Subscription(topics, tps("t0:0 t1:1 t3:0"), 1),
        "C2": Subscription(topics, tps("t1:0 t2:1"), 1),
    }
    got = StickyAssignor().assign(dict.fromkeys(topics, 2), before)
    assert got == {"C0": tps("t0:0 t1:1 t2:0 t3:0"), "C2": tps("t0:1 t1:0 t2:1 t3:1")}


def test_sticky_member_joins_takes_only_the_excess() -> None:
    topics = ["t"]
    s = {
        "a": Subscription(topics, tps("t:0,1,2"), 3),
        "b": Subscription(topics, tps("t:3,4,5"), 3),
        "c": Subscription(topics),
    }
    got = StickyAssignor().assign({"t": 6}, s)
    assert set(got["a"]) < set(tps("t:0,1,2")) and len(got["a"]) == 2
    assert set(got["b"]) < set(tps("t:3,4,5")) and len(got["b"]) == 2
    assert len(got["c"]) == 2


def test_sticky_ignores_claims_of_an_older_generation() -> None:
    s = {
        "a": Subscription(["t"], tps("t:0,1"), 5),
        "b": Subscription(["t"], tps("t:0,1,2,3"), 4),  # missed generation 5: stale
    }
    got = StickyAssignor().assign({"t": 4}, s)
    assert got == {"a": tps("t:0,1"), "b": tps("t:2,3")}


def test_sticky_drops_claims_on_gone_partitions_and_unsubscribed_topics() -> None:
    s = {
        "a": Subscription(["t"], tps("t:0,1,7 u:0"), 2),
        "b": Subscription(["t", "u"], [], 2),
    }
    got = StickyAssignor().assign({"t": 3, "u": 1}, s)
    assert got == {"a": tps("t:0,1"), "b": tps("t:2 u:0")}


def test_sticky_stable_when_nothing_changes() -> None:
    s = {
        "a": Subscription(["t", "u"], tps("t:2 u:0,1"), 9),
        "b": Subscription(["t", "u"], tps("t:0,1 u:2"), 9),
    }
    got = StickyAssignor().assign({"t": 3, "u": 3}, s)
    assert got == {"a": tps("t:2 u:0,1"), "b": tps("t:0,1 u:2")}


@pytest.mark.parametrize("assignor", ALL, ids=lambda a: a.name)
def test_no_members_or_no_topics(assignor: AbstractPartitionAssignor) -> None:
    assert assignor.assign({"t": 3}, {}) == {}
    assert assignor.assign({}, subs(["missing"], "a", "b")) == {"a": [], "b": []}


@pytest.mark.parametrize("assignor", ALL, ids=lambda a: a.name)
def test_more_members_than_partitions(assignor: AbstractPartitionAssignor) -> None:
    got = assignor.assign({"t": 4}, subs(["t"], "m1", "m2", "m3", "m4", "m5"))
    assert sorted(len(v) for v in got.values()) == [0, 1, 1, 1, 1]


# --- properties over random inputs -----------------------------------------------------


def random_case(rng: random.Random, equal: bool) -> tuple[dict[str, int], dict[str, Subscription]]:
    topics = [f"t{i}" for i in range(rng.randint(1, 4))]
    ppt = {t: rng.randint(0, 12) for t in topics}
    members = [f"m{i:02d}" for i in rng.sample(range(40), rng.randint(1, 9))]
    if equal:
        chosen = rng.sample(topics, rng.randint(1, len(topics)))
        return ppt, {m: Subscription(list(chosen)) for m in members}
    return ppt, {m: Subscription(rng.sample(topics, rng.randint(1, len(topics)))) for m in members}


def check_valid(ppt: dict[str, int], s: dict[str, Subscription], got: dict[str, list[TP]]) -> None:
    assert set(got) == set(s), "every member gets an entry"
    expected = sorted(TP(t, p) for t in {t for sub in s.values() for t in sub.topics} for p in range(ppt.get(t, 0)))
    assigned = sorted(tp for v in got.values() for tp in v)
    assert assigned == expected, "every subscribed partition assigned exactly once"
    for m, parts in got.items():
        assert parts == sorted(parts)
        for tp in parts:
            assert tp.topic in s[m].topics, f"{tp} given to {m}, not a subscriber"


@pytest.mark.parametrize("assignor", ALL, ids=lambda a: a.name)
def test_random_inputs_valid(assignor: AbstractPartitionAssignor) -> None:
    rng = random.Random(f"valid-{assignor.name}")
    for _ in range(400):
        ppt, s = random_case(rng, equal=rng.random() < 0.5)
        check_valid(ppt, s, assignor.assign(ppt, s))


@pytest.mark.parametrize("assignor", [RoundRobinAssignor(), StickyAssignor()], ids=lambda a: a.name)
def test_random_equal_subscriptions_balanced(assignor: AbstractPartitionAssignor) -> None:
    rng = random.Random(f"balance-{assignor.name}")
    for _ in range(400):
        ppt, s = random_case(rng, equal=True)
        sizes = [len(v) for v in assignor.assign(ppt, s).values()]
        assert max(sizes) - min(sizes) <= 1, (ppt, s, sizes)


def test_random_range_balanced_per_topic() -> None:
    rng = random.Random("range-balance")
    for _ in range(300):
        ppt, s = random_case(rng, equal=False)
        got = RangeAssignor().assign(ppt, s)
        for t, n in ppt.items():
            counts = [sum(tp.topic == t for tp in got[m]) for m in s if t in s[m].topics]
            if counts:
                assert max(counts) - min(counts) <= 1
                assert sum(counts) == n


def min_moves(owned: dict[str, list[TP]], members: list[str], total: int) -> int:
    """Fewest previously owned partitions that must change owner to reach balance
    (equal subscriptions): the members owning most keep the ``total % n`` larger shares."""
    q, r = divmod(total, len(members))
    counts = sorted((len(owned.get(m, [])) for m in members), reverse=True)
    return sum(max(0, c - (q + 1 if i < r else q)) for i, c in enumerate(counts))


def test_random_sticky_moves_the_minimum() -> None:
    rng = random.Random("sticky-minimal")
    sticky = StickyAssignor()
    for case in range(300):
        topics = [f"t{i}" for i in range(rng.randint(1, 3))]
        ppt = {t: rng.randint(1, 10) for t in topics}
        members = [f"m{i}" for i in range(rng.randint(1, 7))]
        current = sticky.assign(ppt, {m: Subscription(topics) for m in members})
        generation = 1
        for _ in range(6):  # a series of membership / partition-count changes
            change = rng.choice(["join", "leave", "both", "grow"])
            new_members = list(members)
            if change in ("join", "both"):
                new_members += [f"n{case}-{generation}-{k}" for k in range(rng.randint(1, 3))]
            if change in ("leave", "both") and len(new_members) > 1:
                for gone in rng.sample(new_members, rng.randint(1, len(new_members) - 1)):
                    new_members.remove(gone)
            new_ppt = dict(ppt)
            if change == "grow":
                t = rng.choice(topics)
                new_ppt[t] += rng.randint(1, 4)
            s = {m: Subscription(topics, current.get(m, []), generation) for m in new_members}
            got = sticky.assign(new_ppt, s)
            check_valid(new_ppt, s, got)
            sizes = [len(v) for v in got.values()]
            assert max(sizes) - min(sizes) <= 1
            surviving = {m: current[m] for m in new_members if m in current}
            moved = sum(1 for m, parts in surviving.items() for tp in parts if tp not in got[m])
            assert moved == min_moves(surviving, new_members, sum(new_ppt.values())), (current, got)
            members, ppt, current, generation = new_members, new_ppt, got, generation + 1


def test_random_sticky_unequal_subscriptions_keep_what_they_can() -> None:
    rng = random.Random("sticky-unequal")
    sticky = StickyAssignor()
    for _ in range(200):
        ppt, s = random_case(rng, equal=False)
        first = sticky.assign(ppt, s)
        again = sticky.assign(ppt, {m: Subscription(sub.topics, first[m], 1) for m, sub in s.items()})
        assert again == first, "an unchanged group does not move anything"
