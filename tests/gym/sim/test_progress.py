"""The sim gym's progress reward: distance along the solution path, progress, shaped reward."""

from __future__ import annotations

import pytest

from cua_native.actions import models as m
from cua_native.gym.sim import SimGym
from cua_native.gym.sim.progress import progress, shaped_reward, solution_distance


def test_progress_and_shaped_reward_arithmetic() -> None:
    assert progress(3, 3) == 0.0
    assert progress(3, 2) == pytest.approx(1 / 3)
    assert progress(3, 0) == 1.0
    assert progress(3, 5) == 0.0  # a detour past the start is no progress, not negative
    assert progress(0, 0) == 1.0
    assert shaped_reward(True, 0.0, 0.5) == 1.0  # success is worth 1 whatever the path
    assert shaped_reward(False, 2 / 3, 0.5) == pytest.approx(1 / 3)
    assert shaped_reward(False, 1.0, 0.0) == 0.0
    assert shaped_reward(False, 0.2, 0.5, partial=0.5) == 0.5  # never below the validators' share


async def test_distance_counts_the_remaining_solution_and_leaves_the_state_alone() -> None:
    gym = SimGym(seed=0, width=270, height=600)
    execution = gym.new_execution(await gym.get_task("sim-001"))  # open Settings, tap, stop
    space = execution.phone.space
    before = (execution.state.stack[-1], execution.state.wifi_on, execution.state.turn)
    assert solution_distance(execution.task, execution.state, space) == 3
    assert (execution.state.stack[-1], execution.state.wifi_on, execution.state.turn) == before
    await execution.act(m.OpenApp(name="Settings"))
    assert solution_distance(execution.task, execution.state, space) == 2
    assert solution_distance(execution.task, execution.state, space, limit=1) == 1
    await execution.close()


async def test_evaluation_with_progress_reward() -> None:
    gym = SimGym(seed=0, width=270, height=600, progress_reward=0.6)
    task = await gym.get_task("sim-009")  # Settings, Display, the slider, terminate: 4 actions
    execution = await gym.start(task)
    assert execution.start_distance == 4
    first = await execution.evaluate()
    assert (first.success, first.reward, first.raw["progress"]) == (False, 0.0, 0.0)
    await execution.act(m.OpenApp(name="Settings"))
    step = await execution.evaluate()
    assert step.success is False
    assert step.raw["progress"] == pytest.approx(0.25)
    assert step.reward == pytest.approx(0.6 * 0.25)
    await execution.act(m.SystemButton(button="home"))  # back where it started
    assert (await execution.evaluate()).raw["progress"] == 0.0
    await execution.close()
    solved = await gym.start(task)
    await solved.play_solution()
    done = await solved.evaluate()
    assert (done.success, done.reward, done.raw["progress"]) == (True, 1.0, 1.0)
    await solved.close()


async def test_progress_reward_off_by_default_and_checked() -> None:
    gym = SimGym(seed=0, width=270, height=600)
    execution = await gym.start(await gym.get_task("sim-009"))
    await execution.act(m.OpenApp(name="Settings"))
    evaluation = await execution.evaluate()
    assert execution.start_distance is None
    assert evaluation.reward == 0.0 and "progress" not in evaluation.raw
    await execution.close()
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="progress_reward"):
            SimGym(progress_reward=bad)


async def test_a_wrong_answer_or_giving_up_earns_no_credit_for_ending() -> None:
    gym = SimGym(seed=0, width=270, height=600, progress_reward=0.5)
    task = await gym.get_task("sim-021")  # find Olga Rossi's number, then answer it
    wrong = await gym.start(task)
    start = wrong.start_distance
    assert start is not None and start >= 2
    await wrong.act(m.Answer(text="000"))
    evaluation = await wrong.evaluate()
    assert evaluation.success is False
    assert evaluation.raw["progress"] == 0.0 and evaluation.reward == 0.0
    await wrong.close()
    given_up = await gym.start(task)
    await given_up.act(m.Terminate(status="failure"))
    assert (await given_up.evaluate()).raw["progress"] == 0.0
    await given_up.close()


async def test_progress_keeps_the_validators_partial_credit() -> None:
    gym = SimGym(seed=0, width=270, height=600, progress_reward=0.5)
    task = await gym.get_task("sim-012")  # airplane mode on, then Wi-Fi back on: two validators
    execution = await gym.start(task)
    evaluation = await execution.evaluate()  # Wi-Fi is on already: one validator of two passes
    assert evaluation.success is False
    assert evaluation.reward == pytest.approx(0.5)
    await execution.close()
