"""Time that excludes the trainer's pauses, and timeouts measured on it.

AReaL's trainer pauses the rollout for every weight update, checkpoint and eval
(``engine.workflow_executor.pause()``); a request in flight is aborted and AReaL's client waits
until the rollout resumes, then continues it. A turn or episode timeout on the wall clock counts
that wait, so turns time out without ever reaching a server and whole groups are rejected.

``PauseClock`` is a monotonic clock that stands still while the engine reports itself paused
(sampled every ``interval`` seconds on the event loop: AReaL's own client polls the same flag
every 0.5 s). ``clock_timeout`` is ``asyncio.timeout`` on such a clock: when the wall-clock due
time comes it checks how much clock time actually passed and re-arms for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

SAMPLE_INTERVAL_S = 0.1


def engine_pause_probe(engine: Any) -> Callable[[], bool] | None:
    """``engine.workflow_executor.is_paused`` for AReaL's remote engines; ``None`` for engines
    that are never paused (the in-process engine)."""
    try:
        executor = engine.workflow_executor
    except (AttributeError, RuntimeError):
        return None
    probe = getattr(executor, "is_paused", None)
    return probe if callable(probe) else None


class PauseClock:
    """``time.monotonic`` minus the time ``is_paused()`` was seen true (sampled)."""

    def __init__(
        self,
        is_paused: Callable[[], bool],
        *,
        interval: float = SAMPLE_INTERVAL_S,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self._is_paused = is_paused
        self._interval = interval
        self._wall = wall
        self._paused_total = 0.0
        self._paused_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        """Record the current pause state (the sampler calls this; tests may call it)."""
        now = self._wall()
        try:
            paused = bool(self._is_paused())
        except Exception:  # an engine being torn down: count as running
            paused = False
        if paused and self._paused_since is None:
            self._paused_since = now
        elif not paused and self._paused_since is not None:
            self._paused_total += now - self._paused_since
            self._paused_since = None

    def paused_seconds(self) -> float:
        ongoing = 0.0 if self._paused_since is None else self._wall() - self._paused_since
        return self._paused_total + ongoing

    def __call__(self) -> float:
        return self._wall() - self.paused_seconds()

    def start(self) -> None:
        """Start sampling on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pause-clock")

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self._interval)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def clock_timeout(limit: float, clock: Callable[[], float]) -> AsyncIterator[None]:
    """``asyncio.timeout(limit)`` where ``limit`` is measured on ``clock`` (which may run slower
    than the wall clock, never faster). Raises ``TimeoutError`` like ``asyncio.timeout``."""
    loop = asyncio.get_running_loop()
    start = clock()
    async with asyncio.timeout(None) as scope:
        handle: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal handle
            left = limit - (clock() - start)
            if left <= 1e-3:
                scope.reschedule(loop.time())
            else:
                handle = loop.call_later(left, check)

        handle = loop.call_later(limit, check)
        try:
            yield
        finally:
            if handle is not None:
                handle.cancel()
