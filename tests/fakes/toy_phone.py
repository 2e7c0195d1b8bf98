"""A small scripted phone (a real ``Gym``) with solution paths, for the warm-start tests: it
renders labelled app tiles with Pillow; tasks are "open an app" and "go home"; success is read
from its state."""

from __future__ import annotations

import itertools
from typing import Any

from PIL import Image, ImageDraw

from cua_native.actions import models as m
from cua_native.gym.protocol import (
    Evaluation,
    Execution,
    ExecutionGone,
    Observation,
    Screenshot,
    StepResult,
    Task,
)

WIDTH, HEIGHT = 1080, 2400


APPS: dict[str, tuple[tuple[float, float, float, float], tuple[int, int, int]]] = {
    "Settings": ((0.05, 0.15, 0.45, 0.30), (70, 90, 200)),
    "Notes": ((0.55, 0.15, 0.95, 0.30), (230, 180, 40)),
    "Contacts": ((0.05, 0.40, 0.45, 0.55), (40, 160, 90)),
    "Clock": ((0.55, 0.40, 0.95, 0.55), (200, 60, 60)),
}


def _tasks() -> list[Task]:
    tasks = [
        Task(task_id=f"toy-open-{name.lower()}", instruction=f"Open {name}.", max_steps=4)
        for name in APPS
    ]
    tasks += [
        Task(
            task_id=f"toy-home-from-{name.lower()}",
            instruction="Go to the home screen.",
            max_steps=4,
            start=name,
        )
        for name in APPS
    ]
    return tasks


class ToyExecution:
    def __init__(self, task: Task, execution_id: str) -> None:
        self.task = task
        self.execution_id = execution_id
        self.screen: str = (task.model_extra or {}).get("start") or "home"
        self.turn = 0
        self.closed = False

    def _render(self) -> Image.Image:
        image = Image.new("RGB", (WIDTH, HEIGHT), (245, 245, 245))
        draw = ImageDraw.Draw(image)
        if self.screen == "home":
            for name, ((x0, y0, x1, y1), color) in APPS.items():
                box = (x0 * WIDTH, y0 * HEIGHT, x1 * WIDTH, y1 * HEIGHT)
                draw.rectangle(box, fill=color)
                draw.text((box[0] + 20, box[3] - 60), name, fill=(0, 0, 0))
        else:
            draw.rectangle((0, 0, WIDTH, 300), fill=APPS[self.screen][1])
            draw.text((40, 120), self.screen, fill=(255, 255, 255))
        return image

    async def observe(self) -> Observation:
        if self.closed:
            raise ExecutionGone(self.execution_id)
        return Observation(Screenshot(image=self._render()), WIDTH, HEIGHT, self.turn)

    async def act(self, action: m.Action) -> StepResult:
        if self.closed:
            raise ExecutionGone(self.execution_id)
        self.turn += 1
        if isinstance(action, m.Click) and self.screen == "home":
            for name, ((x0, y0, x1, y1), _) in APPS.items():
                if x0 <= action.x < x1 and y0 <= action.y < y1:
                    self.screen = name
        elif isinstance(action, m.SystemButton) and action.button == "home":
            self.screen = "home"
        return StepResult(ok=True, observation=await self.observe())

    def goal(self) -> str:
        if self.task.task_id.startswith("toy-open-"):
            return next(n for n in APPS if n.lower() == self.task.task_id.removeprefix("toy-open-"))
        return "home"

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        success = self.screen == self.goal()
        return Evaluation(reward=float(success), success=success)

    async def close(self) -> None:
        self.closed = True


class ToyGym:
    gym_id = "toy"

    def __init__(self) -> None:
        self._ids = itertools.count()
        self.live: set[str] = set()

    async def list_tasks(self) -> list[Task]:
        return _tasks()

    async def get_task(self, task_id: str) -> Task:
        return next(t for t in _tasks() if t.task_id == task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        execution = ToyExecution(task, f"toy-{next(self._ids)}")
        self.live.add(execution.execution_id)
        original_close = execution.close

        async def close() -> None:
            self.live.discard(execution.execution_id)
            await original_close()

        execution.close = close  # type: ignore[method-assign]
        return execution

    async def aclose(self) -> None:
        return None


async def toy_solver(execution: Any, task: Task) -> tuple[m.Action, str | None] | None:
    """Tap the goal app's tile, or press home; ``None`` once the goal screen shows."""
    goal = execution.goal()
    if execution.screen == goal:
        return None
    if goal == "home":
        return m.SystemButton(button="home"), None
    (x0, y0, x1, y1), _ = APPS[goal]
    return m.Click(x=round((x0 + x1) / 2, 3), y=round((y0 + y1) / 2, 3)), goal
