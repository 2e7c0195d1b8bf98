"""``fork``: an optional capability of the ``Execution`` protocol. The simulator copies its
state exactly (in process and over HTTP); a backend that cannot fork says so."""

from __future__ import annotations

import random

import pytest

from cua_native.actions import models as m
from cua_native.gym.http import HttpGym
from cua_native.gym.protocol import (
    Execution,
    ForkableExecution,
    ForkUnsupported,
    fork_execution,
)
from cua_native.gym.server import create_app
from cua_native.gym.sim import SimGym
from cua_native.gym.sim.gym import SimExecution

from .conftest import CounterGym


def _actions(execution: SimExecution, rng: random.Random, n: int) -> list[m.Action]:
    """A mix of the task's solution steps and random taps, swipes and back presses: what a
    sampling policy does."""
    out: list[m.Action] = []
    for _ in range(n):
        pick = rng.random()
        if pick < 0.4:
            step = execution.solution_step()
            out.append(step[0] if step is not None else m.SystemButton(button="back"))
        elif pick < 0.8:
            out.append(m.Click(x=round(rng.random(), 3), y=round(rng.random(), 3)))
        elif pick < 0.9:
            out.append(m.Swipe(direction=rng.choice(["up", "down"])))
        else:
            out.append(m.SystemButton(button="back"))
    return out


def _pixels(observation_image: object) -> bytes:
    return observation_image.tobytes()  # type: ignore[attr-defined]


@pytest.mark.parametrize("task_id", ["sim-003", "sim-018", "sim-029"])
async def test_a_forked_sim_execution_continues_exactly_as_the_original(task_id: str) -> None:
    gym = SimGym(seed=5, screenshot_size=(160, 384))
    original = await gym.start(await gym.get_task(task_id))
    rng = random.Random(task_id)
    for action in _actions(original, rng, 3):
        await original.act(action)
    fork = await fork_execution(original)
    try:
        assert isinstance(fork, SimExecution) and fork.execution_id != original.execution_id
        assert fork.state == original.state and fork.state is not original.state
        before = await original.observe()
        assert _pixels((await fork.observe()).screenshot.image) == _pixels(before.screenshot.image)
        # the same actions, chosen on the original's screens, played on both
        for action in _actions(original, random.Random(f"{task_id}-tail"), 8):
            a, b = await original.act(action), await fork.act(action)
            assert (a.ok, a.error, a.feedback) == (b.ok, b.error, b.feedback)
            assert a.observation is not None and b.observation is not None
            assert _pixels(a.observation.screenshot.image) == _pixels(
                b.observation.screenshot.image
            )
            assert fork.state == original.state
        first, second = await original.evaluate(), await fork.evaluate()
        assert (first.reward, first.success, first.raw) == (
            second.reward,
            second.success,
            second.raw,
        )
        # independent from here on: acting on the copy leaves the original as it was
        kept = await original.observe()
        await fork.act(m.SystemButton(button="home"))
        await fork.act(m.Click(x=0.5, y=0.5))
        assert _pixels((await original.observe()).screenshot.image) == _pixels(
            kept.screenshot.image
        )
    finally:
        await fork.close()
        await original.close()
    assert gym.live_executions == 0


async def test_a_fork_of_a_closed_execution_is_gone() -> None:
    gym = SimGym(seed=0, screenshot_size=(160, 384))
    execution = await gym.start(await gym.get_task("sim-001"))
    await execution.close()
    with pytest.raises(Exception, match="closed"):
        await execution.fork()


async def test_an_execution_without_fork_says_it_cannot() -> None:
    toy = CounterGym()
    execution: Execution = await toy.start((await toy.list_tasks())[0])
    assert not isinstance(execution, ForkableExecution)
    with pytest.raises(ForkUnsupported, match="cannot fork"):
        await fork_execution(execution)


async def test_fork_over_http_copies_the_server_side_state(serve) -> None:
    sim = SimGym(seed=2, screenshot_size=(160, 384))
    async with serve(create_app({sim.gym_id: sim})) as url:
        gym = HttpGym(url, sim.gym_id)
        try:
            assert (await gym.capabilities())["fork"] is True
            original = await gym.start(await gym.get_task("sim-018"))
            server_original = sim._live[original.execution_id]
            rng = random.Random(7)
            for action in _actions(server_original, rng, 3):
                await original.act(action)
            fork = await fork_execution(original)
            try:
                server_fork = sim._live[fork.execution_id]
                assert server_fork.state == server_original.state
                for action in _actions(server_original, rng, 6):
                    a, b = await original.act(action), await fork.act(action)
                    assert a.observation is not None and b.observation is not None
                    assert a.observation.screenshot.png == b.observation.screenshot.png
                assert server_fork.state == server_original.state
                assert (await original.evaluate()).raw == (await fork.evaluate()).raw
            finally:
                await fork.close()
                await original.close()
            assert sim.live_executions == 0, "the fork is terminated over HTTP like any execution"
        finally:
            await gym.aclose()


async def test_fork_over_http_of_a_gym_that_cannot_is_refused(serve) -> None:
    toy = CounterGym()
    async with serve(create_app({toy.gym_id: toy})) as url:
        gym = HttpGym(url, toy.gym_id)
        try:
            assert (await gym.capabilities())["fork"] is False
            execution = await gym.start((await gym.list_tasks())[0])
            try:
                with pytest.raises(ForkUnsupported, match="501"):
                    await fork_execution(execution)
            finally:
                await execution.close()
        finally:
            await gym.aclose()
