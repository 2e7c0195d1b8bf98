"""The desktop backend against OSWorld's OWN server code (``desktop_env/server/main.py`` of an
xlang-ai/OSWorld checkout, unmodified, run by ``osworld_launcher.py``) on local Xvfb desktops:
every task's demonstration, judged by its evaluator, and a killed server rejected as
infrastructure.

cua_native does not ship OSWorld's server (docs/desktop.md#osworlds-own-server): point
``$CUA_OSWORLD_SERVER_MAIN`` at that ``main.py`` and source ``.ci/desktop.sh`` (it then makes
``.venv-osworld`` with the server's dependencies and exports ``$CUA_OSWORLD_PYTHON``); skipped
otherwise."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cua_native.gym.desktop import reaper
from cua_native.gym.desktop.client import DesktopUnavailable
from cua_native.gym.desktop.demos import DEMONSTRATIONS, demonstrate
from cua_native.gym.desktop.gym import DesktopExecution, DesktopGym
from cua_native.rollout.episode import InfraFailure, _guarded
from cua_native.rollout.records import EndReason

MAIN = os.environ.get("CUA_OSWORLD_SERVER_MAIN", "")
PYTHON = os.environ.get("CUA_OSWORLD_PYTHON", "")
LIMIT_S = 120.0

pytestmark = [
    pytest.mark.skipif(
        not (MAIN and Path(MAIN).is_file() and PYTHON and Path(PYTHON).exists()),
        reason="set CUA_OSWORLD_SERVER_MAIN to OSWorld's desktop_env/server/main.py and source "
        ".ci/desktop.sh (CUA_OSWORLD_PYTHON)",
    ),
    pytest.mark.timeout(600),
]


@pytest.fixture
async def gym(short_tmp: Path) -> AsyncIterator[DesktopGym]:
    desktops = DesktopGym(
        width=1024,
        height=768,
        state_root=str(short_tmp / "desktops"),
        server_python=PYTHON,
        osworld_main=MAIN,
        start_timeout_s=LIMIT_S,  # OSWorld's server imports pyatspi, lxml, numpy: slow on a loaded machine
    )
    try:
        yield desktops
    finally:
        await desktops.aclose()


async def settled_success(execution: DesktopExecution, answer: str | None) -> bool:
    async with asyncio.timeout(LIMIT_S):
        while True:
            if (await execution.evaluate(answer)).success:
                return True
            await asyncio.sleep(0.2)


def _served_by_osworld(execution: DesktopExecution) -> list[int]:
    assert execution.local is not None
    return [
        pid
        for pid in reaper.marked_pids(execution.local.desktop_id)
        if b"osworld_launcher.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


@pytest.mark.parametrize("task_id", sorted(DEMONSTRATIONS))
async def test_scripted_episode_against_osworlds_server(gym: DesktopGym, task_id: str) -> None:
    execution = await gym.start(await gym.get_task(task_id))
    try:
        assert len(_served_by_osworld(execution)) == 1
        observation = await execution.observe()
        assert (observation.width, observation.height) == (1024, 768)
        assert not (await execution.evaluate()).success
        answer = await demonstrate(execution, window_timeout_s=LIMIT_S)
        assert await settled_success(execution, answer)
    finally:
        await execution.close()
    assert list(gym.local.state_root.iterdir()) == []


async def test_a_killed_osworld_server_rejects_the_episode(gym: DesktopGym) -> None:
    execution = await gym.start(await gym.get_task("terminal_hello_file"))
    try:
        [server] = _served_by_osworld(execution)
        os.kill(server, signal.SIGKILL)
        with pytest.raises(InfraFailure) as failure:
            await _guarded(execution.observe(), reason=EndReason.OBSERVE, limit=LIMIT_S)
        assert isinstance(failure.value.__cause__, DesktopUnavailable)
    finally:
        await execution.close()
    assert list(gym.local.state_root.iterdir()) == []
