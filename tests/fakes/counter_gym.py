"""``CounterGym``: a small real ``Gym`` for the server tests (a task succeeds after a number
of clicks; the screen's colour shows the count)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from cua_native.actions.models import Action, Click, ToolCall, TypeText
from cua_native.gym.protocol import (
    Evaluation,
    ExecutionGone,
    GymError,
    Observation,
    Screenshot,
    StepResult,
    Task,
    ValidatorResult,
)

WIDTH, HEIGHT = 90, 200


@dataclass
class CounterExecution:
    """Counts clicks; the task succeeds after ``target`` clicks. Screen colour shows the count."""

    execution_id: str
    task: Task
    gym: CounterGym
    clicks: int = 0
    typed: str = ""
    closed: int = 0
    width: int = WIDTH
    height: int = HEIGHT

    def _check(self) -> None:
        if self.closed:
            raise ExecutionGone(self.execution_id)

    async def observe(self) -> Observation:
        self._check()
        if self.gym.screenshot_url:
            url = f"{self.gym.screenshot_url}/{self.execution_id}/{self.clicks}.png"
            return Observation(Screenshot(url=url), WIDTH, HEIGHT, turn=self.clicks)
        image = Image.new("RGB", (WIDTH, HEIGHT), (min(255, 40 * self.clicks), 10, 200))
        return Observation(Screenshot(image=image), WIDTH, HEIGHT, turn=self.clicks)

    async def act(self, action: Action) -> StepResult:
        self._check()
        if isinstance(action, ToolCall):
            return StepResult(ok=False, error=f"no tool named {action.name!r} here")
        if isinstance(action, Click):
            self.clicks += 1
        if isinstance(action, TypeText):
            self.typed += action.text
        return StepResult(ok=True, observation=await self.observe())

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        self._check()
        target = int(self.task.model_extra.get("target", 3)) if self.task.model_extra else 3
        score = min(1.0, self.clicks / target)
        validators = (
            ValidatorResult("clicks", self.clicks >= target, score, 1.0, f"{self.clicks} clicks"),
        )
        success = self.clicks >= target
        return Evaluation(reward=score, success=success, validators=validators)

    async def close(self) -> None:
        self.closed += 1
        self.gym.close_calls[self.execution_id] += 1


@dataclass
class CounterGym:
    gym_id: str = "toy"
    seed: int = 0
    width: int = WIDTH
    height: int = HEIGHT
    tasks: list[Task] = field(
        default_factory=lambda: [
            Task(
                task_id=f"task-{i:03d}",
                name=f"click {i}",
                instruction=f"Click {i} times",
                tags=["easy" if i < 3 else "hard"],
                target=i,
            )
            for i in range(1, 6)
        ]
    )
    started: list[str] = field(default_factory=list)
    close_calls: Counter[str] = field(default_factory=Counter)
    start_delay_s: float = 0.0
    start_gate: asyncio.Event | None = None
    """When set, ``start`` waits for it: a test decides when a creation finishes."""
    start_calls: int = 0
    fail_starts: int = 0
    screenshot_url: str | None = None
    """Serve screenshots as URLs under this prefix instead of inline PNG."""
    """The next n ``start`` calls fail (a flaky device pool)."""

    async def list_tasks(self) -> list[Task]:
        return list(self.tasks)

    async def get_task(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.task_id == task_id:
                return task
        raise KeyError(task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> CounterExecution:
        assert not (options or {}).keys() & {"client_request_id", "client_deadline_s"}
        self.start_calls += 1
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.start_delay_s:
            await asyncio.sleep(self.start_delay_s)
        if self.fail_starts:
            self.fail_starts -= 1
            raise GymError("device pool exhausted")
        execution_id = f"ex-{len(self.started) + 1}"
        self.started.append(execution_id)
        return CounterExecution(execution_id, task, self)

    async def aclose(self) -> None:
        return None
