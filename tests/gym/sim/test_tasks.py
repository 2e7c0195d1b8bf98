"""The task catalogue: every solution path succeeds, doing nothing fails, evaluation rules."""

from __future__ import annotations

import json

import pytest

from cua_native.actions import models as m
from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import GymError, Task, reward_from_result
from cua_native.gym.sim import SimGym, UnknownTask, catalogue

TASKS = catalogue()


def test_catalogue_shape() -> None:
    tasks = TASKS
    ids = [t.task_id for t in tasks]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    assert ids == [f"sim-{i:03d}" for i in range(1, len(ids) + 1)]
    assert {t.difficulty for t in tasks} == {"easy", "medium", "hard"}
    for task in tasks:
        assert task.instruction and task.app and task.max_steps and task.tags
        assert task.difficulty in task.tags
        again = Task.model_validate(json.loads(task.model_dump_json()))
        assert again == task  # validation, setup and plan survive JSON


async def test_list_and_get_return_copies(gym: SimGym) -> None:
    listed = await gym.list_tasks()
    listed[0].tags.append("mutated")
    assert "mutated" not in (await gym.get_task(listed[0].task_id)).tags


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("style", ["direction", "points"])
async def test_solution_succeeds(small_gym: SimGym, task: Task, seed: int, style: str) -> None:
    execution = await small_gym.start(task, {"seed": seed})
    try:
        actions = await execution.play_solution(style)  # type: ignore[arg-type]
        assert actions[-1].type in m.EPISODE_ENDING
        assert len(actions) <= (task.max_steps or 0)
        evaluation = await execution.evaluate()
        assert evaluation.success, evaluation.validators
        assert evaluation.reward == 1.0
    finally:
        await execution.close()


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
async def test_doing_nothing_fails(small_gym: SimGym, task: Task) -> None:
    for first in (None, m.Terminate(status="success"), m.Answer(text="done")):
        execution = await small_gym.start(task, {"seed": 1})
        if first is not None:
            assert (await execution.act(first)).ok
        evaluation = await execution.evaluate()
        assert not evaluation.success and evaluation.reward < 1.0, task.task_id
        await execution.close()


@pytest.mark.parametrize(("family", "style"), [("mai_ui", "direction"), ("qwen3_vl", "points")])
async def test_solution_actions_are_writable_by_the_dialect(
    small_gym: SimGym, family: str, style: str
) -> None:
    """Demonstrations format every solution action with the family's dialect."""
    dialect = get_dialect(family)
    for task in await small_gym.list_tasks():
        execution = await small_gym.start(task)
        while (step := execution.solution_step(style)) is not None:  # type: ignore[arg-type]
            action, label = step
            assert label is None or (label and not label.endswith("."))
            dialect.format(action, thought="t", image_size=(270, 600))
            await execution.act(action)
            if action.type in m.EPISODE_ENDING:
                break
        await execution.close()


async def test_task_that_came_back_from_json_starts(gym: SimGym) -> None:
    task = await gym.get_task("sim-018")
    wire = Task.model_validate(json.loads(task.model_dump_json()))
    execution = await gym.start(wire, {"seed": 2})
    assert execution.task.task_id == "sim-018"
    await execution.play_solution()
    assert (await execution.evaluate()).success


async def test_phone_number_answer(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-021"))
    phone = execution.state.contact("Olga Rossi").phone  # type: ignore[union-attr]
    assert (await execution.evaluate(f"Her number is {phone}.")).success
    assert (await execution.evaluate(phone.replace("-", " "))).success
    assert not (await execution.evaluate("555-000-0000")).success
    assert not (await execution.evaluate(f"{phone} or 555-000-0000")).success
    assert not (await execution.evaluate(None)).success
    assert not (await execution.evaluate("")).success
    await execution.act(m.Answer(text=phone))
    assert (await execution.evaluate()).success  # the recorded answer counts


async def test_number_answers(gym: SimGym) -> None:
    notes = await gym.start(await gym.get_task("sim-025"))
    count = len(notes.state.notes)
    assert (await notes.evaluate(str(count))).success
    assert (await notes.evaluate(f"There are {count} notes.")).success
    assert not (await notes.evaluate(f"{count} or {count + 1}")).success
    price = await gym.start(await gym.get_task("sim-028"))
    item = price.state.item_named("Amber Candle")
    assert item is not None
    assert (await price.evaluate(item.price_text)).success
    assert not (await price.evaluate("$1.00")).success


async def test_partial_reward_of_multi_step_task(gym: SimGym) -> None:
    execution = await gym.start(await gym.get_task("sim-031"))
    while not (step := execution.solution_step()) or execution.state.bluetooth_on:
        assert step is not None
        await execution.act(step[0])
    evaluation = await execution.evaluate()
    assert not evaluation.success and evaluation.reward == 0.5
    assert [v.passed for v in evaluation.validators] == [True, False]
    assert evaluation.reward == reward_from_result(evaluation.raw, evaluation.success)


async def test_seed_varies_the_phone_not_the_task(gym: SimGym) -> None:
    task = await gym.get_task("sim-013")
    a, b, c = [await gym.start(task, {"seed": s}) for s in (0, 1, 0)]
    assert [x.name for x in a.state.contacts] != [x.name for x in b.state.contacts]
    assert [x.name for x in a.state.contacts] == [x.name for x in c.state.contacts]


async def test_unknown_task_and_bad_options(gym: SimGym) -> None:
    with pytest.raises(UnknownTask, match="sim-999"):
        await gym.get_task("sim-999")
    with pytest.raises(LookupError):
        await gym.start(Task(task_id="nope"))
    assert issubclass(UnknownTask, GymError)
    with pytest.raises(ValueError, match="seed"):
        await gym.start(await gym.get_task("sim-001"), {"seed": "x"})


async def test_a_task_row_pins_its_phone_with_gym_seed(gym: SimGym) -> None:
    """``gym_seed`` on the task chooses the seeded phone unless ``options`` name a seed."""
    task = next(t for t in TASKS if t.task_id == "sim-029")

    async def screen(t: Task, options: dict | None = None) -> bytes:
        execution = await gym.start(t, options)
        try:
            observation = await execution.observe()
            return observation.screenshot.image.tobytes() if observation.screenshot.image else b""
        finally:
            await execution.close()

    opened = {"seed": 5}
    pinned = task.model_copy(update={"gym_seed": 5})
    plain = await screen(task)
    assert await screen(pinned) != plain  # the seed shows on the first screen
    assert await screen(pinned) == await screen(task, opened)
    assert await screen(pinned, {"seed": 0}) == plain
    with pytest.raises(ValueError, match="seed must be an integer"):
        await gym.start(task.model_copy(update={"gym_seed": "x"}))


@pytest.mark.parametrize("seed", [0, 7, 1000])
async def test_one_phone_is_one_phone_whatever_the_task(small_gym: SimGym, seed: int) -> None:
    """The phone's data depends on the seed, not on the task: two tasks that pin nothing the
    home screen shows start from the same pixels, so only the instruction tells them apart (a
    per-task phone let a policy read the task off the status bar;
    bench/experiments/results/one-phone-per-seed/README.md#one-phone-per-seed)."""
    starts = []
    for task_id in ("sim-005", "sim-014", "sim-015"):  # airplane mode, Notes, Clock: no setup
        execution = await small_gym.start(await small_gym.get_task(task_id), {"seed": seed})
        try:
            starts.append(
                (
                    execution.state.battery,
                    [c.name for c in execution.state.contacts],
                    (await execution.observe()).screenshot.image.tobytes(),
                )
            )
        finally:
            await execution.close()
    assert starts[0] == starts[1] == starts[2]
    other = await small_gym.start(await small_gym.get_task("sim-014"), {"seed": seed + 1})
    try:
        assert (
            other.state.battery != starts[0][0]
            or [c.name for c in other.state.contacts] != starts[0][1]
        )
    finally:
        await other.close()
