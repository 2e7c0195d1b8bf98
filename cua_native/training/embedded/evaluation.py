"""The one evaluation: the embedded trainer's baseline and evaluations, and
``python -m cua_native.evaluate``.

An evaluation plays one group per task row (the evaluation agent, ``CUASettings.eval_agent``:
``cua.eval_episodes_per_task`` episodes, ``cua.eval_temperature``) through the rollout workflow,
every group at once, against the given engine, and returns its figures as an ``EvalResult``.
The monitor, when given, records a baseline or an evaluation at ``step`` with its episodes. A
group that fails is logged and leaves its episodes out; the evaluation goes on.

``eval_task_source`` is the one place that says which tasks an evaluation plays:
``cua.eval_tasks`` (else ``cua.tasks``), optionally narrowed by a ``--tasks`` selection read
with the task source's own grammar (task numbers, ``sim-001`` = 1, or task ids).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from cua_native.config import LoadedConfig
from cua_native.gym.protocol import Gym, Task
from cua_native.rollout.config import AgentConfig
from cua_native.rollout.dataset import TaskSource, task_row
from cua_native.rollout.outcomes import TaskOutcomes
from cua_native.rollout.records import (
    EpisodeObserver,
    EpisodeRecord,
    EpisodeTally,
    FanoutObserver,
    NullObserver,
)

if TYPE_CHECKING:  # the workflow imports AReaL and torch
    from cua_native.monitor.client.lifecycle import TrainingMonitor
    from cua_native.rollout.episode import Engine

logger = logging.getLogger(__name__)

EvalKind = Literal["baseline", "eval"]


class PerTaskTally(NullObserver):
    """An episode observer with one ``EpisodeTally`` per task id."""

    __slots__ = ("by_task",)

    def __init__(self) -> None:
        self.by_task: dict[str, EpisodeTally] = {}

    def episode_finished(self, record: EpisodeRecord) -> None:
        task_id = record.context.task.task_id
        self.by_task.setdefault(task_id, EpisodeTally()).episode_finished(record)


@dataclass(frozen=True, slots=True)
class EvalResult:
    """One evaluation's figures."""

    kind: EvalKind
    step: int
    total: EpisodeTally
    per_task: Mapping[str, EpisodeTally]
    """Task id → the tally of its episodes (a task on several gym seeds is one task)."""
    outcomes: dict[str, list[bool]] = field(default_factory=dict)
    """Task id → the success of each of its completed episodes (for the intervals)."""
    failed_groups: int = 0

    @property
    def success_rate(self) -> float:
        return self.total.success_rate

    @property
    def parse_errors_per_turn(self) -> float:
        turns = sum(self.total.turns)
        return sum(self.total.parse_errors.values()) / turns if turns else 0.0

    @property
    def false_done_rate(self) -> float:
        return self.total.false_done_rate


def eval_task_source(
    tasks: TaskSource, eval_tasks: TaskSource | None, selection: str | None = None
) -> TaskSource:
    """The task source an evaluation plays: ``eval_tasks`` (else ``tasks``), narrowed to
    ``selection`` (``--tasks``, ``TaskSource.narrowed_to``) when one is given."""
    base = eval_tasks if eval_tasks is not None else tasks
    return base if selection is None else base.narrowed_to(selection)


@dataclass(slots=True)
class Evaluation:
    """What every evaluation of a run shares: the agent, the tasks and the gym they are played
    on, the processor, and where episodes are recorded."""

    agent: AgentConfig
    """The evaluation agent (``CUASettings.eval_agent()``): its ``group_size`` is the episodes
    per task row."""
    tasks: list[Task]
    gym: Gym
    processor: Any
    task_row: Callable[[Task], dict[str, Any]]
    model_name: str
    monitor: TrainingMonitor | None = None

    @property
    def total_episodes(self) -> int:
        return len(self.tasks) * self.agent.group_size

    async def run(
        self, engine: Engine, *, kind: EvalKind, step: int = 0, concurrency: int | None = None
    ) -> EvalResult:
        """Play every task's group once, at most ``concurrency`` groups at a time (``None``: all
        at once, as the trainer does); the monitor (if any) records it as ``kind``."""
        from cua_native.rollout.workflow import CUAAgentWorkflow

        total, per_task, outcomes = EpisodeTally(), PerTaskTally(), TaskOutcomes()
        observers: list[EpisodeObserver] = [total, per_task, outcomes]
        if self.monitor is not None:
            observers.insert(0, self.monitor.recorder)
            if kind == "baseline":
                self.monitor.baseline_started(self.model_name, total_tasks=self.total_episodes)
            else:
                self.monitor.eval_started(step, self.model_name, total_tasks=self.total_episodes)
        flow = CUAAgentWorkflow(
            self.agent,
            source=kind,
            gym=self.gym,
            processor=self.processor,
            observer=FanoutObserver(*observers),
        )
        rows = [dict(self.task_row(task), global_step=step) for task in self.tasks]
        gate = asyncio.Semaphore(concurrency or max(1, len(rows)))

        async def group(row: dict[str, Any]) -> dict[str, Any] | None:
            async with gate:
                return await flow.arun_episode(engine, row)

        try:
            results = await asyncio.gather(*(group(row) for row in rows), return_exceptions=True)
        finally:
            await flow.aclose()  # its media client and clocks; the gym stays the caller's
        failed = 0
        for result in results:
            if isinstance(result, BaseException):
                failed += 1
                logger.error("%s group failed: %r", kind, result)
        if self.monitor is not None:
            figures = {
                "success_rate": total.success_rate,
                "avg_reward": total.reward_mean,
                "avg_turns": total.turns_mean,
                "successful_tasks": total.successes,
                "completed_tasks": total.completed,
            }
            if kind == "baseline":
                self.monitor.baseline_finished(**figures)
            else:
                self.monitor.eval_finished(step, **figures)
        return EvalResult(kind, step, total, per_task.by_task, outcomes.by_task, failed)


def evaluation_for(
    loaded: LoadedConfig,
    tasks: list[Task],
    *,
    gym: Gym,
    processor: Any,
    monitor: TrainingMonitor | None,
) -> Evaluation:
    """The evaluation of a run of ``loaded``: the trainer's and ``evaluate``'s, built alike."""
    cua = loaded.cua
    return Evaluation(
        agent=cua.eval_agent(),
        tasks=tasks,
        gym=gym,
        processor=processor,
        task_row=functools.partial(task_row, gym_id=gym.gym_id),
        model_name=str(cua.agent.model_path or "embedded tiny Qwen3-VL"),
        monitor=monitor,
    )
