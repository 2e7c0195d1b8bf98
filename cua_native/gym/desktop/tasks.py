"""Desktop tasks in OSWorld's task JSON format, and their ``config`` set-up steps.

A task file is a JSON list of OSWorld tasks: ``id``, ``instruction``, ``config`` (set-up steps),
``related_apps``, ``evaluator`` (``evaluators``). Each becomes a ``Task`` (``task_id`` = ``id``,
``app`` = the first related app) that keeps ``config`` and ``evaluator`` as extra fields.
Unsupported steps, getters or metrics fail at load, naming the task.

Set-up steps (OSWorld's names and parameters): ``launch`` and ``execute``/``command``
(``command``, ``shell``), ``upload_file`` (``files``: ``[{"local_path", "path"}]``, local paths
relative to the task file), ``activate_window`` (``window_name``, ``strict``) — which here waits
for the window to appear (polling, up to ``window_timeout_s``) before activating it, so that
an app that is still starting is not a failed set-up — and ``sleep`` (``seconds``). The
evaluator's ``postconfig`` steps (the same kinds, run before judging, as OSWorld does) are
checked at load like ``config``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from cua_native.gym.desktop.client import DesktopClient, DesktopUnavailable
from cua_native.gym.desktop.evaluators import EvaluatorError, check_evaluator
from cua_native.gym.protocol import Task

DEFAULT_TASK_FILE = Path(__file__).with_name("tasks") / "tasks.json"
SETUP_STEPS = frozenset({"launch", "execute", "command", "upload_file", "activate_window", "sleep"})
WINDOW_POLL_S = 0.1


class TaskFileError(ValueError):
    """A task file that is not OSWorld task JSON of the supported subset."""


def task_from_osworld(data: dict[str, Any], base_dir: Path) -> Task:
    task_id = data.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise TaskFileError(f"a task has no string 'id': {str(data)[:120]}")
    evaluator = data.get("evaluator")
    if not isinstance(evaluator, dict):
        raise TaskFileError(f"task {task_id}: no 'evaluator' object")
    for step in [*data.get("config", []), *evaluator.get("postconfig", [])]:
        if not isinstance(step, dict) or step.get("type") not in SETUP_STEPS:
            raise TaskFileError(
                f"task {task_id}: set-up step {step!r} is not supported; "
                f"supported: {sorted(SETUP_STEPS)}"
            )
        if step["type"] == "upload_file":
            for item in step.get("parameters", {}).get("files", []):
                local = base_dir / item["local_path"]
                if not local.is_file():
                    raise TaskFileError(f"task {task_id}: upload_file {local} does not exist")
                item["local_path"] = str(local)
    try:
        check_evaluator(evaluator)
    except EvaluatorError as exc:
        raise TaskFileError(f"task {task_id}: {exc}") from exc
    apps = data.get("related_apps") or []
    extra = {k: v for k, v in data.items() if k not in ("id", "instruction", "tags")}
    return Task(
        task_id=task_id,
        name=task_id,
        instruction=str(data.get("instruction", "")),
        tags=list(data.get("tags", [])),
        app=apps[0] if apps else None,
        **extra,
    )


def load_tasks(path: Path) -> list[Task]:
    """The tasks of an OSWorld-format task file (a list, or one task object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TaskFileError(f"{path}: {exc}") from exc
    items = data if isinstance(data, list) else [data]
    tasks = [task_from_osworld(item, path.parent) for item in items]
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise TaskFileError(f"{path}: duplicate task ids")
    return tasks


async def window_exists(client: DesktopClient, name: str, *, strict: bool = False) -> bool:
    """Whether a top-level window's title contains ``name`` (case-insensitive; equals it when
    ``strict``), as ``wmctrl -a`` matches: read from ``wmctrl -l`` through ``/execute``. A
    failed listing is "not yet": ``wmctrl`` fails with ``BadWindow`` when a window closes while
    it reads it (LibreOffice's start-up windows do), and callers poll with a limit."""
    result = await client.execute(["wmctrl", "-l"])
    if result.returncode != 0:
        return False
    titles = [
        parts[3] for line in result.output.splitlines() if len(parts := line.split(None, 3)) == 4
    ]
    if strict:
        return name in titles
    return any(name.lower() in title.lower() for title in titles)


async def wait_for_window(
    client: DesktopClient, name: str, *, strict: bool = False, limit_s: float = 60.0
) -> None:
    """Activate the window called ``name``, polling until it exists (at most ``limit_s``).

    Existence is read from the window list, not from ``/setup/activate_window``'s answer:
    OSWorld's own server answers 200 whether or not ``wmctrl`` found the window."""
    try:
        async with asyncio.timeout(limit_s):
            while True:
                if await window_exists(client, name, strict=strict) and await client.window(
                    "/setup/activate_window", name, strict=strict
                ):
                    return
                await asyncio.sleep(WINDOW_POLL_S)
    except TimeoutError as exc:
        raise DesktopUnavailable(f"window {name!r} did not appear within {limit_s} s") from exc


async def run_setup(task: Task, client: DesktopClient, *, window_timeout_s: float = 60.0) -> None:
    """Run the task's ``config`` steps in order; a step that fails raises ``DesktopUnavailable``
    (the set-up is the environment's job, not the agent's)."""
    await run_steps(task, (task.model_extra or {}).get("config", []), client, window_timeout_s)


async def run_steps(
    task: Task, steps: list[dict[str, Any]], client: DesktopClient, window_timeout_s: float
) -> None:
    """Run set-up ``steps`` (``config``, or the evaluator's ``postconfig``) in order."""
    for step in steps:
        kind, params = step["type"], step.get("parameters", {})
        if kind == "sleep":
            await asyncio.sleep(float(params.get("seconds", 0)))
        elif kind == "launch":
            await client.launch(params["command"], shell=bool(params.get("shell", False)))
        elif kind in ("execute", "command"):
            result = await client.execute(
                params["command"], shell=bool(params.get("shell", False)), route="/setup/execute"
            )
            if result.returncode != 0:
                raise DesktopUnavailable(
                    f"task {task.task_id}: set-up command failed ({result.returncode}): "
                    f"{result.error[-300:]}"
                )
        elif kind == "upload_file":
            for item in params.get("files", []):
                data = await asyncio.to_thread(Path(item["local_path"]).read_bytes)
                await client.upload(item["path"], data)
        elif kind == "activate_window":
            await wait_for_window(
                client,
                params["window_name"],
                strict=bool(params.get("strict", False)),
                limit_s=window_timeout_s,
            )
