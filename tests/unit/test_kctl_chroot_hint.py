"""kctl's hint when ``--zookeeper`` names no chroot and the root has no brokers while
another chroot of the ensemble has them (``host:2181`` for a cluster at ``/kbroker``)."""

from __future__ import annotations

from kbroker.cli.backends import other_chroot_hint


def test_no_hint_when_no_other_chroot_has_brokers() -> None:
    assert other_chroot_hint("127.0.0.1:2181", []) is None


def test_the_hint_names_the_chroot_and_the_flag_to_use() -> None:
    line = other_chroot_hint("127.0.0.1:2181", ["/kbroker"])
    assert line == (
        "kctl: no broker is registered at 127.0.0.1:2181; brokers are registered under /kbroker "
        "(use --zookeeper 127.0.0.1:2181/kbroker)"
    )


def test_scripts_runs_chroot_comes_first_and_long_lists_are_cut() -> None:
    line = other_chroot_hint("h:1,h:2/wrong", ["/a", "/b", "/kbroker", "/c", "/d"])
    assert line is not None
    assert "under /kbroker, /a, /b and 2 more" in line
    assert line.endswith("(use --zookeeper h:1,h:2/kbroker)")


def test_brokers_at_the_root() -> None:
    line = other_chroot_hint("h:1/kbroker", ["/"])
    assert line is not None and line.endswith("(use --zookeeper h:1)")
