"""Which training tasks each step of the embedded trainer runs.

``shuffle`` (the default): every task row once per pass, in a seeded random order.

``informative``: GRPO learns only from groups whose episodes' rewards differ (a group that
always or never succeeds has advantage 0 everywhere). Each task id keeps the reward standard
deviation of its latest group; a step draws ``batch_size`` distinct task ids with probability
proportional to that spread plus ``floor`` (so a task that looked settled is retried now and
then), tasks not yet handed out coming first. A drawn task runs its next gym seed (task rows
of one id cycle through their seeds). Deterministic for a given ``random.Random``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from cua_native.gym.protocol import Task
from cua_native.rollout.records import EpisodeRecord, NullObserver

TaskOrderKind = Literal["shuffle", "informative"]


@dataclass(slots=True)
class GroupRewards(NullObserver):
    """An episode observer that keeps the rewards of finished episodes under their task id."""

    by_task: dict[str, list[float]] = field(default_factory=dict)

    def episode_finished(self, record: EpisodeRecord) -> None:
        if record.outcome == "rejected":
            return
        task_id = record.context.task.task_id
        self.by_task.setdefault(task_id, []).append(float(record.reward))


def spread(rewards: Sequence[float]) -> float:
    """Population standard deviation (0 for fewer than two rewards)."""
    if len(rewards) < 2:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


class TaskOrder:
    """Hands out each step's task rows and learns from their groups' rewards."""

    def __init__(
        self,
        rows: Sequence[Task],
        rng: random.Random,
        kind: TaskOrderKind = "shuffle",
        floor: float = 0.05,
    ) -> None:
        if not rows:
            raise ValueError("no training tasks")
        self.rows = list(rows)
        self.rng = rng
        self.kind = kind
        self.floor = floor
        self._queue: list[Task] = []
        self._by_id: dict[str, list[Task]] = {}
        for row in self.rows:
            self._by_id.setdefault(row.task_id, []).append(row)
        self._next_seed = dict.fromkeys(self._by_id, 0)
        self._handed: set[str] = set()
        self.spread: dict[str, float] = {}
        """Task id → reward standard deviation of its latest group (tried tasks only)."""

    def next(self, batch_size: int) -> list[Task]:
        """The task rows of the next step."""
        if self.kind == "shuffle":
            if len(self._queue) < batch_size:
                fresh = list(self.rows)
                self.rng.shuffle(fresh)
                self._queue.extend(fresh)
            batch, self._queue = self._queue[:batch_size], self._queue[batch_size:]
            return batch
        return [self._row_of(task_id) for task_id in self._draw(batch_size)]

    def observe(self, rewards: GroupRewards) -> None:
        """Record the spread of each group of the step just run."""
        for task_id, values in rewards.by_task.items():
            self.spread[task_id] = spread(values)

    def _draw(self, count: int) -> list[str]:
        ids = list(self._by_id)
        untried = [i for i in ids if i not in self._handed]
        self.rng.shuffle(untried)
        chosen = untried[:count]
        left = [i for i in ids if i not in chosen]
        while len(chosen) < count and left:
            weights = [self.spread.get(i, 0.0) + self.floor for i in left]
            pick = self.rng.choices(range(len(left)), weights=weights)[0]
            chosen.append(left.pop(pick))
        self._handed.update(chosen)
        return chosen

    def _row_of(self, task_id: str) -> Task:
        seeds = self._by_id[task_id]
        index = self._next_seed[task_id]
        self._next_seed[task_id] = (index + 1) % len(seeds)
        return seeds[index]
