"""The desktop gym on real Xvfb desktops with real apps and the OSWorld-API server: a scripted
episode per task (success judged from the app's saved state), the screen's real size, OSWorld's
own client against the server, a dead server rejected as infrastructure, and nothing left behind
on success, exception, cancellation or ``kill -9`` of the owner. The scripted episodes are the
package's demonstrator (``gym.desktop.demos``): each task is solvable.

Needs ``.ci/desktop.sh`` (Debian packages and the server's virtual environment): skipped
without them. Waits are bounded polls with generous limits (the machine may be loaded)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cua_native.actions.models import (
    Action,
    Click,
    DoubleClick,
    Drag,
    Key,
    MiddleClick,
    RightClick,
    Scroll,
    TripleClick,
    TypeText,
)
from cua_native.gym.desktop import reaper
from cua_native.gym.desktop.client import DesktopUnavailable
from cua_native.gym.desktop.demos import DEMONSTRATIONS, demonstrate
from cua_native.gym.desktop.gym import DesktopExecution, DesktopGym
from cua_native.gym.desktop.local import LocalDesktop, LocalDesktopConfig, default_server_python
from cua_native.gym.http import HttpGym
from cua_native.gym.protocol import GymError, Task
from cua_native.gym.server import create_app
from cua_native.prompts.a11y import linearize
from cua_native.rollout.episode import InfraFailure, _guarded
from cua_native.rollout.records import EndReason

WIDTH, HEIGHT = 1024, 768
LIMIT_S = 120.0
HERE = Path(__file__).parent
ATSPI_STATE = "https://accessibility.ubuntu.example.org/ns/state"

needs_desktop = pytest.mark.skipif(
    shutil.which("Xvfb") is None
    or shutil.which("localc") is None
    or not Path(default_server_python()).exists(),
    reason="local desktops need `source .ci/desktop.sh` (Xvfb, apps, .venv-desktop)",
)
pytestmark = [pytest.mark.desktop, needs_desktop, pytest.mark.timeout(600)]


@pytest.fixture
async def gym(short_tmp: Path) -> AsyncIterator[DesktopGym]:
    desktops = DesktopGym(width=WIDTH, height=HEIGHT, state_root=str(short_tmp / "desktops"))
    try:
        yield desktops
    finally:
        await desktops.aclose()


def assert_nothing_left(root: Path, desktop_ids: list[str], displays: list[int]) -> None:
    for desktop_id in desktop_ids:
        assert reaper.marked_pids(desktop_id) == [], f"processes of {desktop_id} left"
    assert not root.exists() or list(root.iterdir()) == []
    for display in displays:
        assert not Path(f"/tmp/.X{display}-lock").exists()
        assert not Path(f"/tmp/.X11-unix/X{display}").exists()


def owner_only_socket(path: str) -> bool:
    socket, directory = Path(path), Path(path).parent
    return socket.is_socket() and (directory.stat().st_mode & 0o777) == 0o700


async def settled_success(execution: DesktopExecution, answer: str | None = None) -> bool:
    """Evaluate (with the demonstration's final answer) until the app's saved state shows
    success (apps write asynchronously)."""
    async with asyncio.timeout(LIMIT_S):
        while True:
            if (await execution.evaluate(answer)).success:
                return True
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("task_id", sorted(DEMONSTRATIONS))
async def test_scripted_episode_on_the_real_app(gym: DesktopGym, task_id: str) -> None:
    task = await gym.get_task(task_id)
    execution = await gym.start(task)
    assert execution.local is not None and execution.local.uds is not None
    assert owner_only_socket(execution.local.uds)  # no TCP port: /execute runs any command
    ids, displays = [execution.local.desktop_id], [execution.local.display or 0]
    try:
        observation = await execution.observe()
        assert (observation.width, observation.height) == (WIDTH, HEIGHT)
        assert observation.screenshot.png is not None
        assert not (await execution.evaluate()).success  # not solved before the agent acts
        answer = await demonstrate(execution, window_timeout_s=LIMIT_S)
        assert await settled_success(execution, answer)
    finally:
        await execution.close()
    assert_nothing_left(gym.local.state_root, ids, displays)


async def test_osworld_own_client_against_the_server(short_tmp: Path) -> None:
    """OSWorld's ``PythonController`` speaks TCP only: this desktop listens on loopback."""
    gym = DesktopGym(
        width=WIDTH, height=HEIGHT, state_root=str(short_tmp / "desktops"), listen="tcp"
    )
    execution = await gym.start(await gym.get_task("terminal_hello_file"))
    try:
        host_port = execution.client.base_url.removeprefix("http://")
        host, port = host_port.split(":")
        process = await asyncio.create_subprocess_exec(
            default_server_python(),
            str(HERE / "osworld_client_script.py"),
            host,
            port,
            stdout=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(LIMIT_S):
            out, _ = await process.communicate()
        seen = json.loads(out)
    finally:
        await execution.close()
        await gym.aclose()
    assert seen["screenshot_size"] == [WIDTH, HEIGHT]
    assert seen["screen_size"] == {"width": WIDTH, "height": HEIGHT}
    assert seen["platform"] == "Linux"
    assert seen["tree_root"] == "desktop-frame"  # the AT-SPI tree (xterm itself has none)
    assert seen["file"] == "osworld client\n"
    assert "osworld.txt" in seen["listed"]


async def test_a_dead_server_rejects_the_episode_and_leaves_nothing(gym: DesktopGym) -> None:
    execution = await gym.start(await gym.get_task("terminal_hello_file"))
    assert execution.local is not None
    desktop_id, display = execution.local.desktop_id, execution.local.display or 0
    try:
        servers = _server_pids(desktop_id)
        assert len(servers) == 1
        os.kill(servers[0], signal.SIGKILL)
        with pytest.raises(InfraFailure) as failure:
            await _guarded(execution.observe(), reason=EndReason.OBSERVE, limit=LIMIT_S)
        assert failure.value.reason == EndReason.OBSERVE
        assert isinstance(failure.value.__cause__, DesktopUnavailable)
        assert isinstance(failure.value.__cause__, GymError)
    finally:
        await execution.close()
    assert_nothing_left(gym.local.state_root, [desktop_id], [display])


def _server_pids(desktop_id: str) -> list[int]:
    return [
        pid
        for pid in reaper.marked_pids(desktop_id)
        if b"osworld_server.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def _serving(root: Path) -> bool:
    return root.exists() and any((d / "server.sock").exists() for d in root.iterdir())


def _task(task_id: str, config: list[dict[str, object]]) -> Task:
    evaluator = {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "true", "shell": True},
        "expected": {"type": "rule", "rules": {"expected": ""}},
    }
    return Task(task_id=task_id, config=config, evaluator=evaluator)


async def test_a_failed_setup_leaves_nothing(gym: DesktopGym) -> None:
    task = _task("fails", [{"type": "execute", "parameters": {"command": ["false"]}}])
    with pytest.raises(DesktopUnavailable, match="set-up command failed"):
        await gym.start(task)
    assert_nothing_left(gym.local.state_root, [], [])


async def test_a_cancelled_start_leaves_nothing(gym: DesktopGym) -> None:
    never = [{"type": "activate_window", "parameters": {"window_name": "no such window"}}]
    start = asyncio.create_task(gym.start(_task("never", never)))
    root = gym.local.state_root
    async with asyncio.timeout(LIMIT_S):  # until the desktop is up and set-up is waiting
        while True:
            if _serving(root):
                break
            await asyncio.sleep(0.05)
    [state] = list(root.iterdir())
    display = int((state / "display").read_text())
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert_nothing_left(root, [state.name], [display])


OWNER = """
import asyncio, sys
from pathlib import Path
from cua_native.gym.desktop.local import LocalDesktop, LocalDesktopConfig
async def main():
    desktop = await LocalDesktop.start(LocalDesktopConfig(state_root=Path(sys.argv[1])))
    print(desktop.desktop_id, desktop.display, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def test_kill_9_of_the_owner_is_reaped_by_the_next_start(short_tmp: Path) -> None:
    root = short_tmp / "desktops"
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OWNER, str(root), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(owner.stdout.readline(), LIMIT_S)
        desktop_id, display = line.decode().split()
        assert reaper.marked_pids(desktop_id)  # Xvfb, openbox, the server
    finally:
        owner.kill()  # SIGKILL: the owner gets no chance to clean up
        await owner.wait()
    assert reaper.marked_pids(desktop_id), "the desktop outlived its owner until reaped"
    gym = DesktopGym(width=WIDTH, height=HEIGHT, state_root=str(root))
    execution = await gym.start(await gym.get_task("terminal_make_directory"))
    assert execution.local is not None
    new_id, new_display = execution.local.desktop_id, execution.local.display or 0
    assert reaper.marked_pids(desktop_id) == []
    assert sorted(p.name for p in root.iterdir()) == [new_id]
    await execution.close()
    await gym.aclose()
    assert_nothing_left(root, [desktop_id, new_id], [int(display), new_display])


OWNER_WITH_APP = """
import asyncio, sys
from pathlib import Path
from cua_native.gym.desktop.client import DesktopClient
from cua_native.gym.desktop.local import LocalDesktop, LocalDesktopConfig
async def main():
    desktop = await LocalDesktop.start(LocalDesktopConfig(state_root=Path(sys.argv[1])))
    client = DesktopClient(desktop.url, uds=desktop.uds)
    await client.launch(["xterm"])
    print(desktop.desktop_id, desktop.display, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _runs(desktop_id: str, program: bytes) -> bool:
    for pid in reaper.marked_pids(desktop_id):
        with contextlib.suppress(OSError):
            if program in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
    return False


async def _killed_owner(root: Path, env: dict[str, str]) -> tuple[str, int]:
    """A subprocess starts a desktop under ``root`` with an app on it, then gets ``kill -9``;
    its desktop's id and display, the desktop still live."""
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OWNER_WITH_APP, str(root), stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(owner.stdout.readline(), LIMIT_S)
        desktop_id, display = line.decode().split()
        async with asyncio.timeout(LIMIT_S):  # until the app runs
            while True:
                if _runs(desktop_id, b"xterm"):
                    break
                await asyncio.sleep(0.05)
    finally:
        owner.kill()  # SIGKILL: the owner gets no chance to clean up
        await owner.wait()
    assert len(reaper.marked_pids(desktop_id)) >= 4  # Xvfb, openbox, the server, xterm
    assert reaper.displays_served_by(reaper.marked_pids(desktop_id)) == [int(display)]
    return desktop_id, int(display)


@pytest.mark.parametrize("left", ["other_root", "directory_deleted"])
async def test_a_start_reaps_a_killed_owners_desktop_from_anywhere(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, left: str
) -> None:
    """A desktop of a ``kill -9``-ed owner under another state root (found through the
    registry's manifest), or whose directory and registry entry were deleted too (found by its
    processes' marker, its display by the socket its Xvfb listens on): the next start anywhere removes
    its processes (the app too), display lock and socket, and home."""
    registry = short_tmp / "registry"
    monkeypatch.setenv(reaper.REGISTRY_ENV, str(registry))
    old_root, new_root = short_tmp / "a", short_tmp / "b"
    desktop_id, display = await _killed_owner(old_root, dict(os.environ))
    state = old_root / desktop_id
    assert reaper.read_manifest(state)["display"] == display
    assert (registry / desktop_id).resolve() == state.resolve()
    if left == "directory_deleted":
        shutil.rmtree(old_root)
        (registry / desktop_id).unlink()
    desktop = await LocalDesktop.start(
        LocalDesktopConfig(width=640, height=480, state_root=new_root)
    )
    try:
        assert reaper.marked_pids(desktop_id) == []
        assert not state.exists() and not (registry / desktop_id).exists()
        assert [p.name for p in registry.iterdir()] == [desktop.desktop_id]
    finally:
        await desktop.close()
    assert_nothing_left(old_root, [desktop_id, desktop.desktop_id], [display, desktop.display or 0])
    assert_nothing_left(new_root, [], [])
    assert list(registry.iterdir()) == []


async def test_remote_desktops_are_lent_one_execution_at_a_time(short_tmp: Path) -> None:
    """``remote_urls``: a desktop the gym did not start (here a local one over TCP) is lent to
    one execution at a time and given back on close, not removed."""
    desktop = await LocalDesktop.start(
        LocalDesktopConfig(
            width=WIDTH, height=HEIGHT, state_root=short_tmp / "remote", listen="tcp"
        )
    )
    gym = DesktopGym(remote_urls=[desktop.url])
    try:
        first = await gym.start(await gym.get_task("terminal_make_directory"))
        second = asyncio.create_task(gym.start(await gym.get_task("terminal_hello_file")))
        observation = await first.observe()
        assert (observation.width, observation.height) == (WIDTH, HEIGHT)
        await demonstrate(first, window_timeout_s=LIMIT_S)
        assert await settled_success(first)
        assert not second.done()  # the only desktop is lent to `first`
        await first.close()
        async with asyncio.timeout(LIMIT_S):
            later = await second
        assert later.client.base_url == desktop.url
        assert reaper.marked_pids(desktop.desktop_id)  # lent again, not removed
        await later.close()
    finally:
        await gym.aclose()
        await desktop.close()
    assert_nothing_left(short_tmp / "remote", [desktop.desktop_id], [desktop.display or 0])


PROBE_EVENTS = "~/events.jsonl"
PROBE_CASES: list[tuple[Action, list[tuple[object, ...]]]] = [
    (Click(x=0.25, y=0.5), [("press", 1, 256, 384), ("release", 1, 256, 384)]),
    (DoubleClick(x=0.5, y=0.5), [("press", 1, 512, 384), ("release", 1, 512, 384)] * 2),
    (TripleClick(x=0.1, y=0.9), [("press", 1, 102, 691), ("release", 1, 102, 691)] * 3),
    (RightClick(x=0.75, y=0.25), [("press", 3, 768, 192), ("release", 3, 768, 192)]),
    (MiddleClick(x=0.5, y=0.75), [("press", 2, 512, 576), ("release", 2, 512, 576)]),
    (Drag(x=0.2, y=0.2, x2=0.6, y2=0.7), [("press", 1, 205, 154), ("release", 1, 614, 538)]),
    (Scroll(dy=2, x=0.5, y=0.5), [("press", 4, 512, 384), ("release", 4, 512, 384)] * 2),
    (Scroll(dy=-1, x=0.5, y=0.5), [("press", 5, 512, 384), ("release", 5, 512, 384)]),
    (Scroll(dx=1, x=0.5, y=0.5), [("press", 7, 512, 384), ("release", 7, 512, 384)]),
    (Key(keys=["ctrl", "a"]), [("key", "Control_L"), ("key", "a")]),
    (TypeText(text="Hi!\n"), [("key", k) for k in ("H", "i", "exclam", "Return")]),
]


async def probe_events(execution: DesktopExecution, count: int) -> list[tuple[object, ...]]:
    """The probe's events once there are at least ``count`` (polling); shift presses left
    out (pyautogui presses shift around an upper-case character)."""
    async with asyncio.timeout(LIMIT_S):
        while True:
            data = await execution.client.file(PROBE_EVENTS)
            events = [json.loads(line) for line in (data or b"").decode().splitlines()]
            seen = [
                ("key", e["key"])
                if e["event"] == "key"
                else (e["event"], e["button"], e["x"], e["y"])
                for e in events
                if e.get("key") not in ("Shift_L", "Shift_R")
            ]
            if len(seen) >= count:
                return seen
            await asyncio.sleep(0.1)


async def test_each_action_kind_reaches_a_real_x_client_at_real_pixels(gym: DesktopGym) -> None:
    """What the X server delivers to a real client (``input_probe.py``) for each canonical
    action: the button, the root pixel (unit coordinates × the 1024×768 screen), the keys."""
    probe = [default_server_python(), str(HERE / "input_probe.py"), PROBE_EVENTS]
    task = _task(
        "probe",
        [
            {"type": "launch", "parameters": {"command": probe}},
            {"type": "activate_window", "parameters": {"window_name": "input probe"}},
        ],
    )
    execution = await gym.start(task)
    try:
        total: list[tuple[object, ...]] = []
        for action, expected in PROBE_CASES:
            result = await execution.act(action)
            assert result.ok, result.error
            seen = await probe_events(execution, len(total) + len(expected))
            assert seen[len(total) :] == expected, action
            total += expected
    finally:
        await execution.close()


async def test_the_gym_server_serves_desktops_over_http(short_tmp: Path, serve: Any) -> None:
    """cua_native's gym server with a ``DesktopGym`` and its HTTP client: the task's own
    evaluator decides, and terminating removes the desktop."""
    root = short_tmp / "desktops"
    desktops = DesktopGym(width=WIDTH, height=HEIGHT, state_root=str(root))
    async with serve(create_app({"desktop": desktops})) as url:
        client = HttpGym(url, "desktop")
        try:
            execution = await client.start(await client.get_task("terminal_hello_file"))
            try:
                observation = await execution.observe()
                assert (observation.width, observation.height) == (WIDTH, HEIGHT)
                assert not (await execution.evaluate()).success
                result = await execution.act(TypeText(text="echo hello desktop > ~/hello.txt\n"))
                assert result.ok, result.error
                async with asyncio.timeout(LIMIT_S):
                    while True:
                        if (await execution.evaluate()).success:
                            break
                        await asyncio.sleep(0.2)
            finally:
                await execution.close()
            assert await client.held_executions() == 0
        finally:
            await client.aclose()
            await desktops.aclose()
    assert_nothing_left(root, [], [])


def _text_areas(tree: str) -> list[ET.Element]:
    """The mousepad application's editable text widgets in an ``/accessibility`` tree."""
    root = ET.fromstring(tree)
    [app] = [a for a in root if a.get("name") == "mousepad"]
    return [e for e in app.iter("text") if e.get(f"{{{ATSPI_STATE}}}editable") == "true"]


async def test_the_accessibility_tree_shows_the_apps_widgets_and_follows_an_action(
    short_tmp: Path,
) -> None:
    """With ``accessibility_tree=True`` every observation carries the desktop's real AT-SPI
    tree (mousepad's GTK widgets through the desktop's own accessibility bus): its text area
    is there, empty, and holds the typed text after the action, as the saved file does."""
    gym = DesktopGym(
        width=WIDTH, height=HEIGHT, state_root=str(short_tmp / "d"), accessibility_tree=True
    )
    execution = await gym.start(await gym.get_task("editor_save_note"))
    try:
        before = (await execution.observe()).screenshot.accessibility_tree
        assert before is not None
        [area] = _text_areas(before)
        assert not (area.text or "").strip()
        assert "Mousepad" in linearize(before, 100_000)
        assert (await execution.act(TypeText(text="Dear team"))).ok
        async with asyncio.timeout(LIMIT_S):  # the widget's text, as the app shows it
            while True:
                after = (await execution.observe()).screenshot.accessibility_tree
                assert after is not None
                if [a.text for a in _text_areas(after)] == ["Dear team"]:
                    break
                await asyncio.sleep(0.2)
        assert "\tDear team\t" in linearize(after, 100_000)
    finally:
        await execution.close()
        await gym.aclose()
