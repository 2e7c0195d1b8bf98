"""Timeouts that exclude the trainer's pauses (docs/contracts.md#pause-clock)."""

from __future__ import annotations

import asyncio

import pytest

from cua_native.rollout.pause_clock import PauseClock, clock_timeout, engine_pause_probe


def test_pause_clock_stands_still_while_paused() -> None:
    now = [0.0]
    paused = [False]
    clock = PauseClock(lambda: paused[0], wall=lambda: now[0])
    clock.sample()
    now[0] = 1.0
    paused[0] = True
    clock.sample()
    now[0] = 4.0
    assert clock.paused_seconds() == 3.0  # an ongoing pause counts
    assert clock() == 1.0
    paused[0] = False
    clock.sample()
    now[0] = 6.0
    assert clock.paused_seconds() == 3.0
    assert clock() == 3.0


def test_timeout_does_not_fire_while_the_clock_stands_still() -> None:
    async def main() -> str:
        done = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, done.set)
        async with clock_timeout(0.01, lambda: 0.0):  # a pause longer than the limit
            await done.wait()
        return "finished"

    assert asyncio.run(main()) == "finished"


def test_timeout_fires_on_a_running_clock() -> None:
    async def main() -> None:
        async with clock_timeout(0.01, asyncio.get_running_loop().time):
            await asyncio.Event().wait()

    with pytest.raises(TimeoutError):
        asyncio.run(main())


def test_timeout_counts_only_running_time() -> None:
    """Paused for a while, then running: it fires once the running time reaches the limit."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        resume_at = start + 0.1

        # stands still until resume_at, then runs with the loop's clock
        def clock() -> float:
            return max(0.0, loop.time() - resume_at)

        with pytest.raises(TimeoutError):
            async with clock_timeout(0.05, clock):
                await asyncio.Event().wait()
        return loop.time() - start

    # 0.1 paused + 0.05 running; clock_timeout fires within 1 ms of the limit (its tolerance)
    assert asyncio.run(main()) >= 0.15 - 1e-3


class _Executor:
    def __init__(self) -> None:
        self.paused = False

    def is_paused(self) -> bool:
        return self.paused


class _RemoteLike:
    def __init__(self) -> None:
        self.workflow_executor = _Executor()


def test_engine_probe_reads_areal_pause_flag() -> None:
    engine = _RemoteLike()
    probe = engine_pause_probe(engine)
    assert probe is not None and probe() is False
    engine.workflow_executor.paused = True
    assert probe() is True
    assert engine_pause_probe(object()) is None
