"""Which task rows each training step plays: every task as evenly as the batch allows.

A task source with several gym seeds has one row per (task, phone). Drawing a step's batch
from a shuffle of all rows lets one step hold three phones of one task and none of another,
so an update can trade one task's skill for another's. ``TaskOrder`` draws tasks round-robin
from seeded reshuffled cycles (each task once per cycle) and, for each task, its next phone
from that task's own reshuffled cycle: with ``batch_size`` equal to the number of tasks, every
step plays every task once, on a phone not repeated until all of that task's phones were
played.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from cua_native.gym.protocol import Task


class TaskOrder:
    """Seeded, stratified batches of task rows (rows sharing a ``task_id`` are one task)."""

    def __init__(self, rows: Sequence[Task], rng: random.Random) -> None:
        if not rows:
            raise ValueError("no task rows to order")
        self._rng = rng
        self._by_task: dict[str, list[Task]] = {}
        for row in rows:
            self._by_task.setdefault(row.task_id, []).append(row)
        self._task_cycle: list[str] = []
        self._row_cycles: dict[str, list[Task]] = {task: [] for task in self._by_task}

    @property
    def task_count(self) -> int:
        return len(self._by_task)

    def next_batch(self, size: int) -> list[Task]:
        """``size`` rows; distinct tasks while ``size`` does not exceed the task count."""
        if size < 1:
            raise ValueError(f"batch size must be positive, got {size}")
        batch: list[Task] = []
        in_batch: set[str] = set()
        while len(batch) < size:
            task = self._next_task(avoid=in_batch if len(in_batch) < self.task_count else set())
            batch.append(self._next_row(task))
            in_batch.add(task)
        return batch

    def _next_task(self, avoid: set[str]) -> str:
        if all(task in avoid for task in self._task_cycle):
            fresh = sorted(self._by_task)
            self._rng.shuffle(fresh)
            self._task_cycle[:0] = fresh  # taken from the end: the old cycle's rest first
        for position in range(len(self._task_cycle) - 1, -1, -1):
            if self._task_cycle[position] not in avoid:
                return self._task_cycle.pop(position)
        raise AssertionError("unreachable: a fresh cycle holds every task")

    def _next_row(self, task: str) -> Task:
        cycle = self._row_cycles[task]
        if not cycle:
            cycle.extend(self._by_task[task])
            self._rng.shuffle(cycle)
        return cycle.pop()
