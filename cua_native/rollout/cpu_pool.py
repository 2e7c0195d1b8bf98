"""A thread pool for the rollout's CPU work that serves the episode furthest behind first.

Episodes hand their CPU work (environment set-up, screenshots, prompts) to the event loop's
default executor one step at a time. A first-in-first-out queue advances N episodes started
together in lock step: every environment is created, then every first screenshot rendered,
then every first prompt built, so no request reaches the engine before the whole batch's set-up
is done, and that delay is added to the batch's time. ``RankedPool`` runs queued work in the
order of the submitting episode's ``WORK_RANK``, ``(turn, episode start time)``: the episode on
the earliest turn first (all episodes advance together, none starves), and among episodes on
the same turn the oldest, so a turn's steps run back to back and its request goes out at once.
Work outside an episode (loading, I/O, training rows) runs before episode work, in the order it
came. ``bench/perf/loop.py --pool fifo`` measures the difference.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

WorkRank = tuple[int, float]
"""``(turn, episode start time)``: smaller runs first."""

WORK_RANK: ContextVar[WorkRank | None] = ContextVar("cua_native_work_rank", default=None)
"""The running episode's rank, set by the episode loop (``ranked``); tasks it creates inherit
it. A context variable rather than an argument because the work is submitted by code that knows
nothing of episodes (a gym's executor call, ``asyncio.to_thread``)."""

_UNRANKED: WorkRank = (-1, 0.0)


@contextmanager
def ranked(rank: WorkRank) -> Iterator[None]:
    """Run the block with ``WORK_RANK`` set to ``rank`` (restored afterwards)."""
    token = WORK_RANK.set(rank)
    try:
        yield
    finally:
        WORK_RANK.reset(token)


class RankedPool(ThreadPoolExecutor):
    """``max_workers`` threads taking queued work in ``WORK_RANK`` order (see the module
    docstring); equal ranks in submission order.

    A ``ThreadPoolExecutor`` by type only, because asyncio accepts nothing else as a loop's
    default executor: ``submit`` and ``shutdown`` are its own, on its own queue and threads."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "cua-cpu") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.max_workers = max_workers
        self._prefix = thread_name_prefix
        self._queue: list[tuple[WorkRank, int, Future[Any], Callable[[], Any]]] = []
        self._ready = threading.Condition()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []  # type: ignore[assignment]  # own threads, not the base class's set
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        rank = WORK_RANK.get() or _UNRANKED
        future: Future[T] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            heapq.heappush(
                self._queue, (rank, next(self._order), future, lambda: fn(*args, **kwargs))
            )
            self._ready.notify()
            if len(self._queue) > self._idle and len(self._threads) < self.max_workers:
                self._start_thread()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._ready:
            self._closed = True
            if cancel_futures:
                for _, _, future, _ in self._queue:
                    future.cancel()
                self._queue.clear()
            self._ready.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"{self._prefix}_{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._idle += 1
                    self._ready.wait()
                    self._idle -= 1
                if not self._queue:
                    return  # shut down and drained
                _, _, future, call = heapq.heappop(self._queue)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as error:
                future.set_exception(error)
                del error  # no reference cycle through the traceback
            else:
                future.set_result(result)
