"""``RankedPool``: an executor that runs queued work in ``WORK_RANK`` order."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cua_native.rollout.cpu_pool import WORK_RANK, RankedPool, ranked


def _blocked_pool() -> tuple[RankedPool, threading.Event, threading.Event]:
    """A one-thread pool whose thread is busy until ``release`` is set."""
    pool = RankedPool(max_workers=1)
    running, release = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait(120)  # every test sets it; the bound only ends a broken one

    pool.submit(hold)
    assert running.wait(120)
    return pool, release, running


def test_queued_work_runs_by_turn_then_episode_age_then_arrival() -> None:
    pool, release, _ = _blocked_pool()
    order: list[str] = []
    submissions = [
        ("late episode, turn 0", (0, 20.0)),
        ("early episode, turn 1", (1, 10.0)),
        ("early episode, turn 0", (0, 10.0)),
        ("early episode, turn 0, again", (0, 10.0)),
        ("outside an episode", None),
    ]
    futures = []
    for name, rank in submissions:
        token = WORK_RANK.set(rank)
        futures.append(pool.submit(order.append, name))
        WORK_RANK.reset(token)
    release.set()
    for future in futures:
        future.result(5)
    pool.shutdown()
    assert order == [
        "outside an episode",
        "early episode, turn 0",
        "early episode, turn 0, again",
        "late episode, turn 0",
        "early episode, turn 1",
    ]


def test_results_exceptions_and_thread_names() -> None:
    pool = RankedPool(max_workers=2, thread_name_prefix="cua-cpu")
    assert pool.submit(lambda a, b=0: a + b, 2, b=3).result(5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    names = {pool.submit(lambda: threading.current_thread().name).result(5) for _ in range(8)}
    assert names and all(name.startswith("cua-cpu_") for name in names)
    assert len(pool._threads) <= 2
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)


def test_shutdown_waits_for_queued_work_or_cancels_it() -> None:
    pool, release, _ = _blocked_pool()
    done = pool.submit(time.sleep, 0)
    threading.Timer(0.05, release.set).start()
    pool.shutdown(wait=True)
    assert done.done() and not done.cancelled()

    pool, release, _ = _blocked_pool()
    dropped = pool.submit(time.sleep, 0)
    pool.shutdown(wait=False, cancel_futures=True)
    release.set()
    assert dropped.cancelled()


def test_is_the_event_loops_default_executor_and_ranks_follow_tasks() -> None:
    """asyncio accepts it as a default executor; a rank set in a task reaches the pool through
    ``asyncio.to_thread`` and is inherited by the tasks it starts."""

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        pool = RankedPool(max_workers=1)
        loop.set_default_executor(pool)
        seen: list[object] = []
        original = pool.submit

        def spying(fn, /, *args, **kwargs):
            seen.append(WORK_RANK.get())
            return original(fn, *args, **kwargs)

        pool.submit = spying  # type: ignore[method-assign]
        with ranked((3, 1.5)):
            await asyncio.to_thread(int)
            await asyncio.ensure_future(asyncio.to_thread(int))
        await asyncio.to_thread(int)
        return seen

    assert asyncio.run(main()) == [(3, 1.5), (3, 1.5), None]
