"""The chaos bench's faults (``bench/experiments/chaos.py``) against the real server and client over
loopback: 429 with ``Retry-After``, crashes, and the inference faults of
``cua_native.engine.faults``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cua_native.actions.models import Click
from cua_native.engine.faults import EngineFaults, FaultyEngine, InferenceRestarted
from cua_native.gym.faults import FaultInjector, FaultProfile
from cua_native.gym.http import (
    ExecutionNotFound,
    GymHTTPError,
    GymTimeouts,
    HttpGym,
    RetryPolicy,
)
from cua_native.gym.protocol import Task
from cua_native.gym.server import create_app

GENEROUS = GymTimeouts(
    connect=30.0, read=60.0, create=60.0, act=60.0, evaluate=60.0, terminate=60.0
)
"""No timeout is meant to fire: limits a loaded machine never reaches."""
RETRY = RetryPolicy(attempts=3, backoff_s=0.0, backoff_max_s=0.0, throttle_retries=2)


def _assert_no_leak(app: Any, gym: Any) -> None:
    state = app.state.gym_server
    assert not state.live and not state.creations
    assert all(gym.close_calls[eid] == 1 for eid in gym.started), gym.close_calls


def test_chaos_fates_leave_the_older_fates_unchanged() -> None:
    """The chaos faults draw from streams of their own: a profile's drop/error fates are the
    same with or without them."""
    plain = FaultInjector(FaultProfile(seed=5, error_share={"*": 0.3}, drop_share={"*": 0.3}))
    chaos = FaultInjector(
        FaultProfile(
            seed=5,
            error_share={"*": 0.3},
            drop_share={"*": 0.3},
            throttle_share={"*": 0.5},
            crash_share={"*": 0.5},
            stall_share={"*": 0.5},
            stall_s=1.0,
        )
    )
    for route in ("observation", "actions", "create") * 40:
        a, b = plain.decide(route), chaos.decide(route)  # type: ignore[arg-type]
        assert (a.error, a.drop) == (b.error, b.drop)
    assert not any(chaos.decide("create").crash for _ in range(50))  # no execution to crash


async def test_a_429_is_retried_after_retry_after_on_every_route(toy, serve) -> None:
    faults = FaultProfile(seed=2, throttle_share={"*": 0.5}, retry_after_s=0)
    app = create_app({"toy": toy}, faults)
    patient = RetryPolicy(attempts=3, backoff_s=0.0, backoff_max_s=0.0, throttle_retries=8)
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=patient, timeouts=GENEROUS)
        execution = await gym.start(Task(task_id="task-001"))
        try:
            for _ in range(6):
                await execution.observe()
                assert (await execution.act(Click(x=0.5, y=0.5))).ok
        finally:
            await execution.close()
            await gym.aclose()
        assert gym.call_stats.throttled > 0
        assert gym.call_stats.retries >= gym.call_stats.throttled
        assert len(toy.started) == 1  # a refused create created nothing
    _assert_no_leak(app, toy)


async def test_an_action_still_throttled_is_the_gyms_failure_not_a_refused_action(
    toy, serve
) -> None:
    app = create_app({"toy": toy}, FaultProfile(throttle_share={"actions": 1.0}, retry_after_s=0))
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        execution = await gym.start(Task(task_id="task-001"))
        try:
            with pytest.raises(GymHTTPError) as raised:
                await execution.act(Click(x=0.5, y=0.5))
            assert raised.value.status == 429
            assert gym.call_stats.throttled == RETRY.throttle_retries + 1
            live = app.state.gym_server.live[("toy", execution.execution_id)]
            assert live.execution.clicks == 0  # the action never ran
        finally:
            await execution.close()
            await gym.aclose()
    _assert_no_leak(app, toy)


async def test_a_crash_ends_the_execution_and_later_calls_find_it_gone(toy, serve) -> None:
    app = create_app({"toy": toy}, FaultProfile(crash_share={"observation": 1.0}))
    async with serve(app) as url:
        gym = HttpGym(url, "toy", retries=RETRY, timeouts=GENEROUS)
        execution = await gym.start(Task(task_id="task-001"))
        try:
            with pytest.raises(ExecutionNotFound):  # 502 (retried), then 404
                await execution.observe()
            with pytest.raises(ExecutionNotFound):
                await execution.act(Click(x=0.5, y=0.5))
        finally:
            await execution.close()
            await gym.aclose()
        state = app.state.gym_server
        assert state.crashed == [("toy", execution.execution_id)]
        assert toy.close_calls[execution.execution_id] == 1
    _assert_no_leak(app, toy)


class _Echo:
    def __init__(self) -> None:
        self.calls = 0

    async def agenerate(self, request: Any) -> Any:
        self.calls += 1
        return request

    def destroy(self) -> str:
        return "destroyed"


async def test_inference_faults_are_seeded_and_restarts_generate_nothing() -> None:
    faults = EngineFaults(seed=3, stall_share=0.0, restart_share=0.3)
    fates = []
    for _ in range(2):
        inner = _Echo()
        engine = FaultyEngine(inner, faults)
        outcome = []
        for i in range(40):
            try:
                outcome.append(await engine.agenerate(i) == i)
            except InferenceRestarted:
                outcome.append(False)
        fates.append(outcome)
        assert engine.counts.restarts == outcome.count(False) > 0
        assert inner.calls == outcome.count(True)  # a restarted call never reached the engine
        assert engine.destroy() == "destroyed"  # everything else is the engine's
    assert fates[0] == fates[1]


async def test_an_inference_stall_answers_late_and_intact() -> None:
    engine = FaultyEngine(_Echo(), EngineFaults(stall_share=1.0, stall_s=0.01))
    assert await asyncio.wait_for(engine.agenerate("x"), timeout=60) == "x"
    assert (engine.counts.stalls, engine.counts.stalled_s) == (1, 0.01)
