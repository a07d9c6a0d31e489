"""The purgatory wakes only the waiters of the key that moved, completes each once, and
forgets cancelled ones; asynchronous waiters hold no thread."""

from __future__ import annotations

import asyncio
import threading
import time

from kbroker.purgatory import Purgatory


def test_progress_on_one_key_checks_only_its_waiters() -> None:
    purgatory = Purgatory()
    checked: list[str] = []
    ready = {"a": False, "b": False}

    def check(name: str) -> bool:
        checked.append(name)
        return ready[name]

    wa = purgatory.watch([("t", 0)], lambda: check("a"))
    wb = purgatory.watch([("t", 1)], lambda: check("b"))
    checked.clear()
    for _ in range(100):
        purgatory.progress(("t", 0))
    assert checked == ["a"] * 100  # the waiter on t-1 was never looked at
    ready["a"] = True
    purgatory.progress(("t", 0))
    assert wa.done and not wb.done
    checked.clear()
    purgatory.progress(("t", 0))
    assert checked == []  # completed waiters are gone
    assert purgatory.waiting() == 1


def test_a_waiter_ready_at_registration_completes_at_once() -> None:
    purgatory = Purgatory()
    w = purgatory.watch(["k"], lambda: True)
    assert w.done and w.wait(0)


def test_cancel_forgets_the_waiter() -> None:
    purgatory = Purgatory()
    w = purgatory.watch(["k", "j"], lambda: False)
    assert purgatory.waiting() == 1
    purgatory.cancel(w)
    purgatory.cancel(w)
    assert purgatory.waiting() == 0
    purgatory.progress("k")
    assert not w.done


def test_a_failing_check_completes_the_waiter() -> None:
    purgatory = Purgatory()

    def boom() -> bool:
        raise RuntimeError("partition went away")

    assert purgatory.watch(["k"], boom).done


def test_blocking_wait_is_woken_by_progress_from_another_thread() -> None:
    purgatory = Purgatory()
    flag = threading.Event()
    w = purgatory.watch(["k"], flag.is_set)

    def later() -> None:
        time.sleep(0.05)
        flag.set()
        purgatory.progress("k")

    threading.Thread(target=later).start()
    start = time.monotonic()
    assert w.wait(5)
    assert time.monotonic() - start < 2


def test_async_waiters_hold_no_thread_and_time_out() -> None:
    async def main() -> tuple[int, float, bool]:
        purgatory = Purgatory()
        loop = asyncio.get_running_loop()
        before = set(threading.enumerate())
        waiters = [purgatory.watch([("t", i % 7)], lambda: False, loop) for i in range(1000)]
        start = time.monotonic()
        results = await asyncio.gather(*(w.wait_async(0.2) for w in waiters))
        elapsed = time.monotonic() - start
        threads = len(set(threading.enumerate()) - before)
        for w in waiters:
            purgatory.cancel(w)
        return threads, elapsed, any(results) or purgatory.waiting() != 0

    threads, elapsed, anything = asyncio.run(main())
    assert threads == 0
    assert elapsed < 2.0
    assert not anything


def test_async_waiter_is_completed_from_another_thread() -> None:
    async def main() -> bool:
        purgatory = Purgatory()
        flag = threading.Event()
        w = purgatory.watch(["k"], flag.is_set, asyncio.get_running_loop())

        def later() -> None:
            time.sleep(0.05)
            flag.set()
            purgatory.progress("k")

        threading.Thread(target=later).start()
        return await w.wait_async(5)

    assert asyncio.run(main())


def test_close_completes_everyone_and_later_waiters_at_once() -> None:
    purgatory = Purgatory()
    w = purgatory.watch(["k"], lambda: False)
    purgatory.close()
    assert w.done
    assert purgatory.watch(["j"], lambda: False).done
