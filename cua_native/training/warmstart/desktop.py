"""Warm-start demonstrations from real desktops: ``DesktopGym`` played by the scripted
demonstrator (``gym.desktop.demos.DEMONSTRATIONS``), as ``demos.sim_source`` plays the
simulator's solution paths.

The solver hands out a task's demonstrated actions one per call; a ``WaitForWindow`` step is
waited for inside the call (the dialog is on screen before the next action is demonstrated,
as it is when the demonstrator runs alone); the end of the list is ``None`` once the
desktop's state shows the task done (the warm start then demonstrates ``terminate(success)``); an ``answer``/``terminate`` step (the infeasible
tasks' ``terminate(failure)``) is the path's last turn, judged by ``evaluate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

from cua_native.actions import models as m
from cua_native.gym.desktop.demos import DEMONSTRATIONS, WaitForWindow
from cua_native.gym.desktop.gym import DesktopExecution, DesktopGym
from cua_native.gym.desktop.tasks import wait_for_window
from cua_native.gym.protocol import Execution, Gym, Task
from cua_native.training.warmstart.demos import DemoError, DemoSource, Solver

SETTLE_POLL_S = 0.2


class DesktopSolver:
    """Next demonstrated action per execution (keyed by its id; one solver serves many)."""

    def __init__(self, window_timeout_s: float) -> None:
        self._window_timeout_s = window_timeout_s
        self._played: dict[str, int] = {}

    async def __call__(
        self, execution: Execution, task: Task
    ) -> tuple[m.Action, str | None] | None:
        if not isinstance(execution, DesktopExecution):
            raise DemoError(f"{task.task_id}: desktop demonstrations need a DesktopExecution")
        try:
            steps = DEMONSTRATIONS[task.task_id]
        except KeyError:
            raise DemoError(f"{task.task_id}: no desktop demonstration") from None
        index = self._played.get(execution.execution_id, 0)
        while index < len(steps):
            step = steps[index]
            index += 1
            self._played[execution.execution_id] = index
            if isinstance(step, WaitForWindow):
                await wait_for_window(execution.client, step.name, limit_s=self._window_timeout_s)
                continue
            if isinstance(step, m.Answer | m.Terminate):
                self._played.pop(execution.execution_id, None)
            return step, None
        self._played.pop(execution.execution_id, None)
        await self._settled(execution)
        return None

    async def _settled(self, execution: DesktopExecution) -> None:
        """Until the desktop's state shows the task done (bounded): apps save asynchronously
        (LibreOffice writes the .ods after ctrl+s returns), and the path's evaluation follows
        at once. Past the limit the evaluation decides (the path is then left out)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._window_timeout_s):
                while True:
                    if (await execution.evaluate()).success:
                        return
                    await asyncio.sleep(SETTLE_POLL_S)


def desktop_source(
    executor: Any = None, options: dict[str, Any] | None = None
) -> tuple[Gym, Solver]:
    """Local desktops (``DesktopGym(**options)``, the training gym's options, so the
    demonstrations show the screens training shows) and the demonstrator."""
    gym = DesktopGym(**dict(options or {}))
    return gym, DesktopSolver(gym.window_timeout_s)


def desktop_source_for(options: dict[str, Any]) -> DemoSource:
    return functools.partial(desktop_source, options=dict(options))
