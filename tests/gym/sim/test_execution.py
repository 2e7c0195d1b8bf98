"""``SimExecution`` as an ``Execution``: observations, determinism, close, concurrency."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from cua_native.actions import models as m
from cua_native.gym.protocol import Execution, ExecutionGone, Gym
from cua_native.gym.sim import SimGym

SCRIPT: list[m.Action] = [
    m.OpenApp(name="contacts"),
    m.Swipe(direction="up"),
    m.Click(x=0.5, y=0.4),
    m.SystemButton(button="back"),
    m.OpenApp(name="settings"),
    m.Click(x=0.5, y=0.14),
]


async def test_protocols_and_observation(gym: SimGym) -> None:
    assert isinstance(gym, Gym) and gym.gym_id == "sim"
    execution = await gym.start(await gym.get_task("sim-001"))
    assert isinstance(execution, Execution)
    first = await execution.observe()
    image = first.screenshot.image
    assert image is not None and image.mode == "RGB" and image.size == (1080, 2400)
    assert (first.width, first.height, first.turn) == (1080, 2400, 0)
    assert (await execution.observe()).screenshot.image is image  # one cached frame
    step = await execution.act(m.OpenApp(name="settings"))
    assert step.ok and step.observation is not None  # the act renders the next screen
    after = await execution.observe()
    assert after.turn == 1 and after.screenshot.image is not image
    assert after.screenshot.image is step.observation.screenshot.image
    await execution.close()


async def test_the_act_screen_is_the_observed_screen() -> None:
    """The frame an act returns equals what observing the same state renders."""
    eager, lazy = SimGym(screenshot_size=(160, 384)), SimGym(screenshot_size=(160, 384))
    task = await eager.get_task("sim-013")
    one, other = await eager.start(task), await lazy.start(task)
    for action in SCRIPT:
        step = await one.act(action)
        await other.act(action)
        other._frame = None  # force a fresh render of the same state
        assert step.observation is not None and step.observation.screenshot.image is not None
        fresh = (await other.observe()).screenshot.image
        assert fresh is not None
        assert step.observation.screenshot.image.tobytes() == fresh.tobytes()
        assert step.observation.turn == (await other.observe()).turn


async def _frames(gym: SimGym, seed: int) -> list[bytes]:
    execution = await gym.start(await gym.get_task("sim-013"), {"seed": seed})
    frames = []
    for action in SCRIPT:
        await execution.act(action)
        image = (await execution.observe()).screenshot.image
        assert image is not None
        frames.append(image.tobytes())
    await execution.close()
    return frames


async def test_same_seed_and_actions_give_identical_screenshots() -> None:
    with ThreadPoolExecutor(2) as pool:
        a = await _frames(SimGym(seed=0), seed=4)
        b = await _frames(SimGym(seed=9, executor=pool), seed=4)
    assert a == b
    assert a != await _frames(SimGym(), seed=5)  # the seed changes the contacts list


async def test_any_screen_size_keeps_the_layout() -> None:
    for width, height in ((720, 1600), (1440, 2560), (100, 200)):
        gym = SimGym(width=width, height=height)
        execution = await gym.start(await gym.get_task("sim-001"))
        await execution.play_solution()
        assert (await execution.evaluate()).success
        image = (await execution.observe()).screenshot.image
        assert image is not None and image.size == (width, height)


async def test_close_is_idempotent_and_final(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-001"))
    assert gym.live_executions == 1
    await execution.close()
    await execution.close()
    assert gym.live_executions == 0
    with pytest.raises(ExecutionGone):
        await execution.act(m.Wait())
    with pytest.raises(ExecutionGone):
        await execution.observe()
    with pytest.raises(ExecutionGone):
        await execution.evaluate()
    with pytest.raises(ExecutionGone):
        execution.solution_step()


async def test_aclose_closes_every_execution(gym: SimGym) -> None:
    executions = [await gym.start(await gym.get_task("sim-002")) for _ in range(3)]
    await gym.aclose()
    await gym.aclose()
    for execution in executions:
        with pytest.raises(ExecutionGone):
            await execution.observe()


async def test_200_concurrent_executions(small_gym: SimGym) -> None:
    tasks = await small_gym.list_tasks()
    executions = await asyncio.gather(
        *(small_gym.start(tasks[i % len(tasks)], {"seed": i}) for i in range(200))
    )
    assert small_gym.live_executions == 200
    assert len({e.execution_id for e in executions}) == 200

    async def step(execution: object) -> bool:
        assert hasattr(execution, "solution_step")
        planned = execution.solution_step()  # type: ignore[attr-defined]
        action = planned[0] if planned else m.Terminate(status="success")
        await asyncio.gather(execution.act(action), execution.observe())  # type: ignore[attr-defined]
        return action.type in m.EPISODE_ENDING

    running = list(executions)
    for _ in range(max(t.max_steps or 0 for t in tasks)):
        done = await asyncio.gather(*(step(e) for e in running))
        running = [e for e, finished in zip(running, done, strict=True) if not finished]
        if not running:
            break
    assert not running
    evaluations = await asyncio.gather(*(e.evaluate() for e in executions))
    assert all(ev.success for ev in evaluations)
    await asyncio.gather(*(e.close() for e in executions))
    assert small_gym.live_executions == 0
