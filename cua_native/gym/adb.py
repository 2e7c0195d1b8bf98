"""Android device backend over ADB (``adbutils``), for genv deployments that hand out
``device.device_serial``: screenshots by ``screencap -p``, actions by ``input``, apps by ``monkey``.

``adb_commands`` is the pure mapping canonical action → shell argv lists (MobileWorld semantics). ``AdbDevice`` runs them in a worker thread with a timeout
per command. ``AdbExecution`` observes and acts on the device and hands evaluate/close to the gym
execution that owns the device (genv's evaluate and terminate); ``AdbGym`` wires the two together.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import adbutils

from cua_native.actions.coords import PixelSpace, clamp_unit
from cua_native.actions.models import (
    Action,
    Click,
    DoubleClick,
    Drag,
    Key,
    LongPress,
    OpenApp,
    Scroll,
    Swipe,
    SystemButton,
    TripleClick,
    TypeText,
)
from cua_native.gym.protocol import (
    Evaluation,
    Execution,
    Gym,
    GymError,
    Observation,
    Screenshot,
    StepResult,
    Task,
)
from cua_native.gym.wire import WireError, png_size

log = logging.getLogger(__name__)
_T = TypeVar("_T")

SWIPE_MS = 400
LONG_PRESS_MS = 1000
DOUBLE_TAP_GAP_S = "0.1"
ADB_KEYBOARD_ACTION = "ADB_INPUT_B64"
NO_DEVICE_EFFECT = frozenset({"wait", "terminate", "answer", "ask_user"})

BUTTON_KEYCODES = {
    "back": "KEYCODE_BACK",
    "home": "KEYCODE_HOME",
    "menu": "KEYCODE_MENU",
    "enter": "KEYCODE_ENTER",
}
NAMED_KEYCODES = {
    "enter": "KEYCODE_ENTER",
    "return": "KEYCODE_ENTER",
    "back": "KEYCODE_BACK",
    "home": "KEYCODE_HOME",
    "menu": "KEYCODE_MENU",
    "tab": "KEYCODE_TAB",
    "space": "KEYCODE_SPACE",
    "backspace": "KEYCODE_DEL",
    "delete": "KEYCODE_FORWARD_DEL",
    "del": "KEYCODE_DEL",
    "escape": "KEYCODE_ESCAPE",
    "esc": "KEYCODE_ESCAPE",
    "up": "KEYCODE_DPAD_UP",
    "down": "KEYCODE_DPAD_DOWN",
    "left": "KEYCODE_DPAD_LEFT",
    "right": "KEYCODE_DPAD_RIGHT",
    "ctrl": "KEYCODE_CTRL_LEFT",
    "control": "KEYCODE_CTRL_LEFT",
    "shift": "KEYCODE_SHIFT_LEFT",
    "alt": "KEYCODE_ALT_LEFT",
    "meta": "KEYCODE_META_LEFT",
    "volume_up": "KEYCODE_VOLUME_UP",
    "volume_down": "KEYCODE_VOLUME_DOWN",
    "power": "KEYCODE_POWER",
    "search": "KEYCODE_SEARCH",
    "app_switch": "KEYCODE_APP_SWITCH",
    "recent": "KEYCODE_APP_SWITCH",
}


class UnsupportedOnDevice(ValueError):
    """The action has no meaning on a touch screen (mouse buttons, pointer moves) or needs
    something the device is not configured for (unicode text without ADBKeyboard)."""


def _keycode(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    if key in NAMED_KEYCODES:
        return NAMED_KEYCODES[key]
    if len(key) == 1 and (key.isascii() and key.isalnum()):
        return f"KEYCODE_{key.upper()}"
    if key.startswith("f") and key[1:].isdigit() and 1 <= int(key[1:]) <= 12:
        return f"KEYCODE_{key.upper()}"
    if key.startswith("keycode_"):
        return key.upper()
    raise UnsupportedOnDevice(f"no Android keycode for key {name!r}")


def _input_text_arg(text: str) -> str:
    """``input text`` takes one word: spaces are written ``%s``. Quoting for the device shell is
    done by adbutils (``shlex.quote`` of every argv item)."""
    return text.replace(" ", "%s")


def _type_commands(text: str, adb_keyboard: bool) -> list[list[str]]:
    if not text:
        return []
    if adb_keyboard:
        encoded = base64.b64encode(text.encode("utf-8")).decode("ascii")
        return [["am", "broadcast", "-a", ADB_KEYBOARD_ACTION, "--es", "msg", encoded]]
    if not text.isascii() or any(ch in text for ch in "\t\r"):
        raise UnsupportedOnDevice(
            f"'input text' can only type printable ASCII; configure ADBKeyboard for {text[:40]!r}"
        )
    commands: list[list[str]] = []
    for index, line in enumerate(text.split("\n")):
        if index:
            commands.append(["input", "keyevent", "KEYCODE_ENTER"])
        if line:
            commands.append(["input", "text", _input_text_arg(line)])
    return commands


def _package_of(name: str, app_packages: Mapping[str, str]) -> str:
    by_lower = {k.strip().lower(): v for k, v in app_packages.items()}
    package = by_lower.get(name.strip().lower())
    if package:
        return package
    if "." in name and " " not in name.strip():
        return name.strip()
    raise UnsupportedOnDevice(f"unknown app {name!r}; known: {sorted(app_packages)}")


def adb_commands(
    action: Action,
    screen_w: int,
    screen_h: int,
    app_packages: Mapping[str, str],
    *,
    adb_keyboard: bool = False,
) -> list[list[str]]:
    """Shell argv lists that perform ``action`` on a ``screen_w`` × ``screen_h`` device.

    Episode-control actions (``wait``, ``terminate``, ``answer``, ``ask_user``) give ``[]``;
    the executor handles them. Raises ``UnsupportedOnDevice`` for what a phone cannot do.
    """
    space = PixelSpace(screen_w, screen_h)

    def px(x: float, y: float) -> list[str]:
        return [str(v) for v in space.from_unit(x, y)]

    if action.type in NO_DEVICE_EFFECT:
        return []
    if isinstance(action, Click):
        return [["input", "tap", *px(action.x, action.y)]]
    if isinstance(action, DoubleClick | TripleClick):
        taps = 2 if isinstance(action, DoubleClick) else 3
        tap = ["input", "tap", *px(action.x, action.y)]
        commands = [tap]
        for _ in range(taps - 1):
            commands += [["sleep", DOUBLE_TAP_GAP_S], tap]
        return commands
    if isinstance(action, LongPress):
        ms = LONG_PRESS_MS if action.duration is None else max(1, round(action.duration * 1000))
        point = px(action.x, action.y)
        return [["input", "swipe", *point, *point, str(ms)]]
    if isinstance(action, Drag):
        if action.x is None or action.y is None:
            raise UnsupportedOnDevice("a drag from the current pointer needs a pointer; give x, y")
        return [["input", "swipe", *px(action.x, action.y), *px(action.x2, action.y2), "400"]]
    if isinstance(action, Swipe):
        return [["input", "swipe", *_swipe_points(action, space), str(SWIPE_MS)]]
    if isinstance(action, Scroll):
        return [["input", "swipe", *_scroll_points(action, space), str(SWIPE_MS)]]
    if isinstance(action, TypeText):
        return _type_commands(action.text, adb_keyboard)
    if isinstance(action, Key):
        codes = [_keycode(k) for k in action.keys]
        if len(codes) == 1:
            return [["input", "keyevent", codes[0]]]
        return [["input", "keycombination", *codes]]
    if isinstance(action, SystemButton):
        return [["input", "keyevent", BUTTON_KEYCODES[action.button]]]
    if isinstance(action, OpenApp):
        package = _package_of(action.name, app_packages)
        return [["monkey", "-p", package, "-c", "android.intent.category.LAUNCHER", "1"]]
    raise UnsupportedOnDevice(f"action {action.type!r} has no touch-screen equivalent")


def _swipe_points(action: Swipe, space: PixelSpace) -> list[str]:
    """Finger direction: up → dy = −0.4·W, down → +0.4·W, left → dx = −0.2·W, right → +0.2·W
    (W = device width, MobileWorld), from (x, y) or the screen centre; or start → end."""
    x = 0.5 if action.x is None else action.x
    y = 0.5 if action.y is None else action.y
    if action.x2 is not None and action.y2 is not None:
        x2, y2 = action.x2, action.y2
    elif action.direction is not None:
        w = space.width
        dx_px, dy_px = {
            "up": (0.0, -0.4 * w),
            "down": (0.0, 0.4 * w),
            "left": (-0.2 * w, 0.0),
            "right": (0.2 * w, 0.0),
        }[action.direction]
        x2 = clamp_unit(x + dx_px / space.width)
        y2 = clamp_unit(y + dy_px / space.height)
    else:
        raise UnsupportedOnDevice("a swipe needs a direction or an end point (x2, y2)")
    return [str(v) for v in (*space.from_unit(x, y), *space.from_unit(x2, y2))]


def _scroll_points(action: Scroll, space: PixelSpace) -> list[str]:
    """Wheel pixels → finger swipe: wheel up (``dy`` > 0) reveals what is above, so the finger
    moves down; wheel right (``dx`` > 0) moves the finger left."""
    if action.dx == 0 and action.dy == 0:
        raise UnsupportedOnDevice("a scroll needs a non-zero dx or dy")
    x = 0.5 if action.x is None else action.x
    y = 0.5 if action.y is None else action.y
    x2 = clamp_unit(x - action.dx / space.width)
    y2 = clamp_unit(y + action.dy / space.height)
    return [str(v) for v in (*space.from_unit(x, y), *space.from_unit(x2, y2))]


class AdbCommandError(GymError):
    """A device shell command failed, timed out, or the device is unreachable."""


@dataclass
class AdbDevice:
    """One device by serial. Every blocking adbutils call runs in a worker thread."""

    serial: str
    host: str = "127.0.0.1"
    port: int = 5037
    command_timeout_s: float = 20.0
    screencap_timeout_s: float = 30.0
    _device: adbutils.AdbDevice | None = field(default=None, init=False, repr=False)

    def _dev(self) -> adbutils.AdbDevice:
        if self._device is None:
            client = adbutils.AdbClient(
                host=self.host, port=self.port, socket_timeout=self.command_timeout_s
            )
            self._device = client.device(serial=self.serial)
        return self._device

    async def shell(self, argv: list[str]) -> str:
        """Run one command; raises ``AdbCommandError`` on a non-zero exit or a timeout."""

        def run() -> str:
            result = self._dev().shell2(argv, timeout=self.command_timeout_s, rstrip=True)
            if result.returncode != 0:
                raise AdbCommandError(
                    f"{self.serial}: {' '.join(argv)!r} exited {result.returncode}: "
                    f"{str(result.output)[:300]}"
                )
            return str(result.output)

        return await self._run(run, self.command_timeout_s + 5)

    async def screencap_png(self) -> bytes:
        def run() -> bytes:
            data = self._dev().shell(
                ["screencap", "-p"], timeout=self.screencap_timeout_s, encoding=None
            )
            assert isinstance(data, bytes)
            return data

        return await self._run(run, self.screencap_timeout_s + 5)

    async def _run(self, fn: Callable[[], _T], limit: float) -> _T:
        try:
            async with asyncio.timeout(limit):
                return await asyncio.to_thread(fn)
        except AdbCommandError:
            raise
        except TimeoutError as exc:
            raise AdbCommandError(f"{self.serial}: adb call took longer than {limit} s") from exc
        except (adbutils.AdbError, OSError) as exc:
            raise AdbCommandError(f"{self.serial}: adb failed: {exc}") from exc


@dataclass(eq=False)
class AdbExecution:
    """Observe and act on a device; evaluate/close go to ``owner`` (the gym execution that
    handed out the device), which decides success from device state and releases the device."""

    device: AdbDevice
    owner: Execution
    app_packages: Mapping[str, str] = field(default_factory=dict)
    adb_keyboard: bool = False
    wait_default_s: float = 1.0
    _size: tuple[int, int] | None = field(default=None, init=False)
    _turn: int = field(default=0, init=False)

    @property
    def execution_id(self) -> str:
        return self.owner.execution_id

    @property
    def task(self) -> Task:
        return self.owner.task

    async def observe(self) -> Observation:
        png = await self.device.screencap_png()
        try:
            width, height = png_size(png)
        except WireError as exc:
            raise AdbCommandError(f"{self.device.serial}: screencap gave no PNG: {exc}") from exc
        self._size = (width, height)
        return Observation(Screenshot(png=png), width, height, turn=self._turn)

    async def act(self, action: Action) -> StepResult:
        if self._size is None:
            await self.observe()
        assert self._size is not None
        try:
            commands = adb_commands(
                action, *self._size, self.app_packages, adb_keyboard=self.adb_keyboard
            )
        except UnsupportedOnDevice as exc:
            return StepResult(ok=False, error=str(exc))
        if action.type == "wait":
            seconds = getattr(action, "seconds", None)
            await asyncio.sleep(self.wait_default_s if seconds is None else seconds)
        for argv in commands:
            await self.device.shell(argv)
        self._turn += 1
        return StepResult(ok=True)

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        return await self.owner.evaluate(answer)

    async def close(self) -> None:
        await self.owner.close()


@dataclass
class AdbGym:
    """A gym (e.g. ``HttpGym`` on genv) that hands out ``device.device_serial``, driven by ADB."""

    inner: Gym
    adb_host: str = "127.0.0.1"
    adb_port: int = 5037
    app_packages: Mapping[str, str] = field(default_factory=dict)
    adb_keyboard: bool = False

    @property
    def gym_id(self) -> str:
        return self.inner.gym_id

    async def list_tasks(self) -> list[Task]:
        return await self.inner.list_tasks()

    async def get_task(self, task_id: str) -> Task:
        return await self.inner.get_task(task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        owner = await self.inner.start(task, options)
        try:
            device = getattr(owner, "device", None)
            serial = device.get("device_serial") if isinstance(device, dict) else None
            if not isinstance(serial, str) or not serial:
                raise GymError(f"execution {owner.execution_id} has no device.device_serial")
            return AdbExecution(
                AdbDevice(serial, self.adb_host, self.adb_port),
                owner,
                self.app_packages,
                self.adb_keyboard,
            )
        except BaseException:
            await owner.close()
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()
