"""``TaskOrder``: the shuffle order of old, and the informative draw."""

from __future__ import annotations

import random

import pytest

from cua_native.gym.protocol import Task
from cua_native.rollout.records import EpisodeContext, EpisodeRecord
from cua_native.training.task_order import GroupRewards, TaskOrder, spread


def rows(ids: list[str], seeds: int) -> list[Task]:
    return [
        Task.model_validate({"task_id": i, "instruction": i, "gym_seed": s})
        for i in ids
        for s in range(seeds)
    ]


def finished(task: Task, reward: float, outcome: str = "completed") -> EpisodeRecord:
    record = EpisodeRecord(context=EpisodeContext(task=task, group_id="g"))
    record.outcome = outcome  # type: ignore[assignment]
    record.reward = reward
    return record


def test_shuffle_is_the_seeded_pass_order() -> None:
    tasks = rows(["a", "b", "c"], 2)
    order = TaskOrder(tasks, random.Random(7))
    expected = list(tasks)
    random.Random(7).shuffle(expected)
    assert order.next(4) + order.next(2) == expected


def test_group_rewards_and_spread() -> None:
    task = rows(["a"], 1)[0]
    rewards = GroupRewards()
    for value in (1.0, 0.0, 1.0, 0.0):
        rewards.episode_finished(finished(task, value))
    rewards.episode_finished(finished(task, 5.0, outcome="rejected"))
    assert rewards.by_task == {"a": [1.0, 0.0, 1.0, 0.0]}
    assert spread(rewards.by_task["a"]) == pytest.approx(0.5)
    assert spread([0.3]) == 0.0


def test_informative_tries_every_task_then_favours_spread() -> None:
    tasks = rows(["a", "b", "c", "d"], 3)
    order = TaskOrder(tasks, random.Random(0), "informative", floor=0.01)
    first = order.next(2) + order.next(2)
    assert sorted(t.task_id for t in first) == ["a", "b", "c", "d"]  # untried come first
    assert all(t.model_extra == {"gym_seed": 0} for t in first)
    rewards = GroupRewards()
    for task in first:
        values = (1.0, 0.0) if task.task_id == "c" else (0.0, 0.0)
        for value in values:
            rewards.episode_finished(finished(task, value))
    order.observe(rewards)
    assert order.spread == {"a": 0.0, "b": 0.0, "c": 0.5, "d": 0.0}
    drawn = [t for _ in range(40) for t in order.next(2)]
    counts = {i: sum(t.task_id == i for t in drawn) for i in "abcd"}
    assert counts["c"] >= 36  # weight 0.51 against 0.01 each: in nearly every batch
    assert sum(counts.values()) == 80 and min(counts.values()) > 0  # the floor retries the rest
    seeds = [t.model_extra["gym_seed"] for t in drawn if t.task_id == "c"]  # type: ignore[index]
    assert seeds[:4] == [1, 2, 0, 1]  # each draw of a task plays its next gym seed
