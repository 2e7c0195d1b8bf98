"""Training lifecycle hooks for ``train.py``: the training row, steps, baseline and evals.

``TrainingMonitor`` is synchronous (the trainer's loop is) and forwards to a ``Recorder``; used
as a context manager it marks the training ``running`` on entry, ``completed`` on a normal exit
and ``failed`` with the error when an exception leaves the block (the exception propagates).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

from cua_native.gym.protocol import Task
from cua_native.monitor.client.recorder import Recorder


class TrainingMonitor:
    def __init__(
        self,
        recorder: Recorder,
        *,
        model_name: str,
        config: Any = None,
        total_steps: int | None = None,
        experiment: str | None = None,
        trial: str | None = None,
        **training_fields: Any,
    ) -> None:
        self.recorder = recorder
        self.total_steps = total_steps
        self._start = {
            "model_name": model_name,
            "config": {"experiment_name": experiment, "trial_name": trial, "config": config},
            "total_steps": total_steps,
            "status_message": f"{experiment}/{trial}" if experiment or trial else None,
            **training_fields,
        }

    def __enter__(self) -> TrainingMonitor:
        self.recorder.training_started(**self._start)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.recorder.training_finished("completed")
        elif isinstance(exc, KeyboardInterrupt):
            self.recorder.training_finished("cancelled")
        else:
            self.recorder.training_failed(exc)

    def tasks(self, tasks: Iterable[Task]) -> None:
        self.recorder.tasks_registered(tasks)

    def step_started(self, step: int) -> None:
        self.recorder.step_started(step, total_steps=self.total_steps)

    def step_training(self, step: int) -> None:
        self.recorder.step_training(step)

    def step_finished(self, step: int, stats: dict[str, float]) -> None:
        """``stats``: the trainer's scalar stats; the usual names fill the step's columns and
        all of them go to ``metrics_json``."""
        self.recorder.step_finished(
            step,
            loss=_first(stats, "loss", "actor/loss", "ppo_actor/loss"),
            kl=_first(stats, "kl", "kl_divergence", "actor/kl", "ppo_actor/kl"),
            reward_mean=_first(stats, "reward_mean", "reward/mean", "rollout/reward", "reward"),
            reward_std=_first(stats, "reward_std", "reward/std"),
            num_tokens=_int(_first(stats, "num_tokens", "tokens", "n_tokens")),
            num_trajectories=_int(_first(stats, "num_trajectories", "n_seqs")),
            learning_rate=_first(stats, "learning_rate", "lr", "actor/lr"),
            grad_norm=_first(stats, "grad_norm", "actor/grad_norm", "ppo_actor/grad_norm"),
            metrics=dict(stats),
        )

    def baseline_started(self, model_path: str, total_tasks: int | None = None) -> None:
        self.recorder.baseline_started(model_path, total_tasks=total_tasks)

    def baseline_finished(self, **results: Any) -> None:
        self.recorder.baseline_finished(**results)

    def eval_started(self, step: int, model_path: str, total_tasks: int | None = None) -> None:
        self.recorder.eval_started(step, model_path, total_tasks=total_tasks)

    def eval_progress(self, step: int, completed: int, total: int | None = None) -> None:
        self.recorder.eval_progress(step, completed, total_tasks=total)

    def eval_finished(self, step: int, **results: Any) -> None:
        self.recorder.eval_finished(step, **results)


def _first(stats: dict[str, float], *names: str) -> float | None:
    for name in names:
        value = stats.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
