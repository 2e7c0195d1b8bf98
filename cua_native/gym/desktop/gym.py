"""``DesktopGym``: the ``Gym``/``Execution`` protocol on real desktops that speak OSWorld's
desktop-server API — local ones (``local.LocalDesktop``: a fresh Xvfb desktop per execution) or
remote ones (``remote_urls``: each lent to one execution at a time, as it is; resetting a remote
desktop, e.g. reverting its VM, is the remote side's job).

Tasks are OSWorld task JSON (``tasks.load_tasks``). ``start`` brings a desktop, runs the task's
``config`` set-up steps and hands out a ``DesktopExecution``: ``observe`` is the server's
screenshot at the screen's real resolution (with ``accessibility_tree=True`` also the
server's ``/accessibility`` tree on the ``Screenshot``; local desktops serve the AT-SPI tree
unless ``accessibility=False``), ``act`` maps a canonical action to pyautogui
commands (``actions.desktop_commands``) run through ``/execute``, ``evaluate`` runs the task's
evaluator on the desktop's state (``evaluators``), ``close`` releases the desktop (idempotent,
shielded from cancellation). A desktop that cannot be reached raises ``DesktopUnavailable`` (a
``GymError``: the episode is rejected as infrastructure, never scored).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from cua_native.actions.models import Action, OpenApp, Wait
from cua_native.gym.desktop.actions import UnsupportedOnDesktop, desktop_commands
from cua_native.gym.desktop.client import DesktopClient, DesktopTimeouts, DesktopUnavailable
from cua_native.gym.desktop.evaluators import evaluate
from cua_native.gym.desktop.local import LocalDesktop, LocalDesktopConfig
from cua_native.gym.desktop.tasks import DEFAULT_TASK_FILE, load_tasks, run_setup, run_steps
from cua_native.gym.protocol import (
    Evaluation,
    GymError,
    Observation,
    Screenshot,
    StepResult,
    Task,
)
from cua_native.gym.wire import WireError, png_size

DEFAULT_APPS = {
    "terminal": ["xterm"],
    "xterm": ["xterm"],
    "text editor": ["mousepad"],
    "mousepad": ["mousepad"],
    "file manager": ["pcmanfm"],
    "files": ["pcmanfm"],
    "pcmanfm": ["pcmanfm"],
    "calculator": ["galculator"],
    "galculator": ["galculator"],
    "libreoffice calc": ["localc"],
    "calc": ["localc"],
    "spreadsheet": ["localc"],
}


@dataclass(eq=False)
class _Lease:
    """A desktop held by one execution: its client and how to give it back."""

    client: DesktopClient
    local: LocalDesktop | None = None
    remote_url: str | None = None
    released: bool = False


class DesktopExecution:
    """One task on one desktop."""

    def __init__(self, gym: DesktopGym, task: Task, lease: _Lease) -> None:
        self._gym = gym
        self._task = task
        self._lease = lease
        self._execution_id = uuid.uuid4().hex
        self._size: tuple[int, int] | None = None
        self._turn = 0
        self._closing: asyncio.Task[None] | None = None

    @property
    def execution_id(self) -> str:
        return self._execution_id

    @property
    def task(self) -> Task:
        return self._task

    @property
    def client(self) -> DesktopClient:
        return self._lease.client

    @property
    def local(self) -> LocalDesktop | None:
        """The local desktop behind this execution (``None`` for a remote one)."""
        return self._lease.local

    def _check_open(self) -> None:
        if self._closing is not None:
            raise DesktopUnavailable(f"execution {self._execution_id} is closed")

    async def observe(self) -> Observation:
        self._check_open()
        png = await self.client.screenshot()
        try:
            width, height = png_size(png)
        except WireError as exc:
            raise DesktopUnavailable(f"/screenshot: not a PNG: {exc}") from exc
        self._size = (width, height)
        tree = await self.client.accessibility() if self._gym.accessibility_tree else None
        screenshot = Screenshot(png=png, accessibility_tree=tree)
        return Observation(screenshot, width, height, turn=self._turn)

    async def accessibility_tree(self) -> str:
        """The desktop's accessibility tree as OSWorld's ``/accessibility`` gives it (optional
        capability; not part of the ``Execution`` protocol)."""
        self._check_open()
        return await self.client.accessibility()

    async def act(self, action: Action) -> StepResult:
        self._check_open()
        if self._size is None:
            self._size = await self.client.screen_size()
        self._turn += 1
        if isinstance(action, Wait):
            await asyncio.sleep(
                self._gym.wait_default_s if action.seconds is None else action.seconds
            )
            return StepResult(ok=True)
        if isinstance(action, OpenApp):
            command = self._gym.apps.get(action.name.strip().lower())
            if command is None:
                return StepResult(
                    ok=False, error=f"unknown app {action.name!r}; known: {sorted(self._gym.apps)}"
                )
            await self.client.launch(command)
            return StepResult(ok=True)
        try:
            commands = desktop_commands(action, *self._size)
        except UnsupportedOnDesktop as exc:
            return StepResult(ok=False, error=str(exc))
        for argv in commands:
            result = await self.client.execute(argv)
            if result.returncode != 0:
                return StepResult(ok=False, error=f"the desktop refused it: {result.error[-300:]}")
        return StepResult(ok=True)

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        """Judged from the desktop's state only; ``answer`` counts only as the agent declaring
        the task infeasible (``FAIL_ANSWER``: OSWorld's ``infeasible`` contract, ``evaluators``)."""
        self._check_open()
        evaluator = (self._task.model_extra or {}).get("evaluator")
        if not isinstance(evaluator, dict):
            raise GymError(f"task {self._task.task_id} has no OSWorld 'evaluator'")
        postconfig = evaluator.get("postconfig", [])
        await run_steps(self._task, postconfig, self.client, self._gym.window_timeout_s)
        return await evaluate(evaluator, self.client, answer)

    async def close(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._gym._release(self._lease))
        await asyncio.shield(self._closing)


class DesktopGym:
    """Real desktops for ``tasks`` (default: cua_native's desktop tasks). ``remote_urls`` lends
    those desktops instead of starting local ones."""

    def __init__(
        self,
        tasks: Sequence[Task] | None = None,
        *,
        task_file: str | None = None,
        gym_id: str = "desktop",
        width: int = 1280,
        height: int = 800,
        state_root: str | None = None,
        server_python: str | None = None,
        start_timeout_s: float = 60.0,
        listen: Literal["unix", "tcp"] = "unix",
        osworld_main: str | None = None,
        window_timeout_s: float = 60.0,
        remote_urls: Sequence[str] = (),
        timeouts: DesktopTimeouts | dict[str, float] | None = None,
        apps: dict[str, list[str]] | None = None,
        wait_default_s: float = 1.0,
        accessibility_tree: bool = False,
        accessibility: bool = True,
    ) -> None:
        self._gym_id = gym_id
        self._tasks = (
            list(tasks) if tasks is not None else load_tasks(Path(task_file or DEFAULT_TASK_FILE))
        )
        self._by_id = {t.task_id: t for t in self._tasks}
        local = LocalDesktopConfig(
            width=width,
            height=height,
            start_timeout_s=start_timeout_s,
            listen=listen,
            osworld_main=osworld_main,
            accessibility=accessibility,
        )
        if state_root is not None:
            local = replace(local, state_root=Path(state_root))
        if server_python is not None:
            local = replace(local, server_python=server_python)
        self.local = local
        self.window_timeout_s = window_timeout_s
        self.timeouts = (
            timeouts
            if isinstance(timeouts, DesktopTimeouts)
            else DesktopTimeouts(**(timeouts or {}))
        )
        self.apps = {k.lower(): list(v) for k, v in (apps or DEFAULT_APPS).items()}
        self.wait_default_s = wait_default_s
        self.accessibility_tree = accessibility_tree
        self._free_urls: asyncio.Queue[str] | None = None
        self._remote_urls = list(remote_urls)
        self._live: set[_Lease] = set()

    @property
    def gym_id(self) -> str:
        return self._gym_id

    async def list_tasks(self) -> list[Task]:
        return list(self._tasks)

    async def get_task(self, task_id: str) -> Task:
        try:
            return self._by_id[task_id]
        except KeyError:
            raise LookupError(f"no desktop task {task_id!r}") from None

    async def _acquire(self) -> _Lease:
        if not self._remote_urls:
            desktop = await LocalDesktop.start(self.local)
            client = DesktopClient(desktop.url, uds=desktop.uds, timeouts=self.timeouts)
            return _Lease(client, local=desktop)
        if self._free_urls is None:
            self._free_urls = asyncio.Queue()
            for url in self._remote_urls:
                self._free_urls.put_nowait(url)
        url = await self._free_urls.get()
        return _Lease(DesktopClient(url, timeouts=self.timeouts), remote_url=url)

    async def _release(self, lease: _Lease) -> None:
        """Give the desktop back exactly once (a local one is removed, a remote one lent again)."""
        if lease.released:
            return
        lease.released = True
        self._live.discard(lease)
        try:
            await lease.client.aclose()
        finally:
            if lease.local is not None:
                await lease.local.close()
            if lease.remote_url is not None and self._free_urls is not None:
                self._free_urls.put_nowait(lease.remote_url)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> DesktopExecution:
        lease = await self._acquire()
        self._live.add(lease)
        try:
            await run_setup(task, lease.client, window_timeout_s=self.window_timeout_s)
        except BaseException:
            await asyncio.shield(self._release(lease))
            raise
        return DesktopExecution(self, task, lease)

    async def aclose(self) -> None:
        """Release every desktop still held (executions not closed by their owner)."""
        for lease in list(self._live):
            await self._release(lease)


def serve_desktops(seed: int = 0) -> DesktopGym:
    """Local desktops for the gym server, so CPU nodes host desktops for a GPU cluster::

        python -m cua_native.gym.server --gym cua_native.gym.desktop.gym:serve_desktops \
            --gym-id desktop --max-live 8 --idle-ttl-s 900

    (``seed`` is the server's factory argument; desktops have no randomness to seed.)"""
    return DesktopGym()
