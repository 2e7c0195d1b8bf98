"""``FaultyGym``: a real gym wrapped to fail on demand (creates, acts, closes), counting
executions started and closed."""

from __future__ import annotations

import asyncio
from typing import Any

from cua_native.gym.protocol import Execution, Gym, GymError, Task


class FaultyGym:
    """Wraps a real gym; raises ``GymError`` on the calls named in ``fail`` (``"start"``,
    ``"observe"``, ``"act"``, ``"evaluate"``; each with the 1-based call counts that fail, or
    ``None`` for all) or hangs on ``hang``; counts executions started and closed. ``crash``
    names calls (same form) before which the execution dies: the inner execution is closed, so
    the call meets the inner gym's own ``ExecutionGone``. ``replays`` is what it answers to
    ``replays_exactly`` (``ReplayableGym``; off by default: nothing is restored)."""

    def __init__(
        self,
        inner: Gym,
        fail: dict[str, set[int] | None] | None = None,
        hang: set[str] | None = None,
        crash: dict[str, set[int] | None] | None = None,
        replays: bool = False,
    ) -> None:
        self.inner = inner
        self.gym_id = inner.gym_id
        self.fail = fail or {}
        self.hang = hang or set()
        self.crash = crash or {}
        self.replays = replays
        self.crashed: list[str] = []
        self.counts: dict[str, int] = {}
        self.started = 0
        self.closed = 0

    async def check(self, call: str) -> None:
        self.counts[call] = self.counts.get(call, 0) + 1
        if call in self.hang:
            await asyncio.sleep(3600)
        if call in self.fail:
            which = self.fail[call]
            if which is None or self.counts[call] in which:
                raise GymError(f"injected {call} failure #{self.counts[call]}")

    async def maybe_crash(self, call: str, execution: Execution) -> None:
        """Close ``execution`` when this call (counted by ``check``) is named in ``crash``."""
        if call in self.crash:
            which = self.crash[call]
            if which is None or self.counts[call] in which:
                self.crashed.append(execution.execution_id)
                await execution.close()

    async def replays_exactly(self) -> bool:
        return self.replays

    async def list_tasks(self) -> list[Task]:
        return await self.inner.list_tasks()

    async def get_task(self, task_id: str) -> Task:
        return await self.inner.get_task(task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        await self.check("start")
        execution = await self.inner.start(task, options)
        self.started += 1
        return _FaultyExecution(execution, self)  # type: ignore[return-value]

    async def aclose(self) -> None:
        await self.inner.aclose()


class _FaultyExecution:
    def __init__(self, inner: Execution, gym: FaultyGym) -> None:
        self.inner = inner
        self.gym = gym
        self.execution_id = inner.execution_id
        self.task = inner.task
        self.closes = 0

    async def observe(self) -> Any:
        await self.gym.check("observe")
        await self.gym.maybe_crash("observe", self.inner)
        return await self.inner.observe()

    async def act(self, action: Any) -> Any:
        await self.gym.check("act")
        await self.gym.maybe_crash("act", self.inner)
        return await self.inner.act(action)

    async def evaluate(self, answer: str | None = None) -> Any:
        await self.gym.check("evaluate")
        await self.gym.maybe_crash("evaluate", self.inner)
        return await self.inner.evaluate(answer)

    async def close(self) -> None:
        await self.inner.close()
        if self.closes == 0:
            self.gym.closed += 1
        self.closes += 1
