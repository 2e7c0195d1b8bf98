"""TaskOrder: every task once per step when the batch holds them all; phones rotate."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cua_native.gym.protocol import Task
from cua_native.training.embedded.task_order import TaskOrder


def rows(tasks: int, phones: int) -> list[Task]:
    return [
        Task(task_id=f"t{t}", instruction=f"task {t}", gym_seed=phone)
        for phone in range(phones)
        for t in range(tasks)
    ]


def key(row: Task) -> tuple[str, int]:
    return row.task_id, int((row.model_extra or {})["gym_seed"])


def test_a_batch_of_every_task_plays_each_once_and_rotates_phones() -> None:
    order = TaskOrder(rows(12, 8), random.Random(1))
    played: Counter[tuple[str, int]] = Counter()
    for _ in range(8):
        batch = order.next_batch(12)
        assert sorted(r.task_id for r in batch) == sorted(f"t{t}" for t in range(12))
        played.update(key(r) for r in batch)
    # eight steps = every (task, phone) row exactly once
    assert set(played.values()) == {1} and len(played) == 96


def test_smaller_batches_spread_tasks_evenly() -> None:
    order = TaskOrder(rows(6, 2), random.Random(0))
    counts: Counter[str] = Counter()
    for _ in range(6):
        batch = order.next_batch(4)
        assert len({r.task_id for r in batch}) == 4
        counts.update(r.task_id for r in batch)
    assert set(counts.values()) == {4}  # 24 draws over 6 tasks


def test_batches_larger_than_the_task_count_repeat_tasks() -> None:
    batch = TaskOrder(rows(3, 4), random.Random(0)).next_batch(7)
    assert len(batch) == 7
    assert max(Counter(r.task_id for r in batch).values()) == 3


def test_seeded() -> None:
    def draw(seed: int) -> list[tuple[str, int]]:
        order = TaskOrder(rows(5, 3), random.Random(seed))
        return [key(r) for _ in range(4) for r in order.next_batch(3)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_rejects_empty_rows_and_sizes() -> None:
    with pytest.raises(ValueError):
        TaskOrder([], random.Random(0))
    with pytest.raises(ValueError):
        TaskOrder(rows(2, 1), random.Random(0)).next_batch(0)
