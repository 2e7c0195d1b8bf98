"""Canonical action → commands for an OSWorld desktop server's ``/execute``, in OSWorld's own
style: ``python -c "import pyautogui; import time; pyautogui.FAILSAFE = False; <call>"`` (the
prefix of OSWorld's ``PythonController.execute_python_command``), with pixel coordinates of the
real screen. Text that pyautogui cannot type (non-ASCII) or types wrong (``<``, which its X11
backend sends as ``>``; ``tests/gym/desktop``'s ``terminal_count_lines`` demonstration types it)
goes through ``xdotool type``.

``desktop_commands`` is pure; ``UnsupportedOnDesktop`` marks what a desktop cannot do (an
``ok=False`` step for the agent, not a crash). Episode-control actions give ``[]``.
"""

from __future__ import annotations

from cua_native.actions.coords import PixelSpace
from cua_native.actions.models import (
    Action,
    Click,
    DoubleClick,
    Drag,
    Key,
    LongPress,
    MiddleClick,
    MouseMove,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    TripleClick,
    TypeText,
)

PYAUTOGUI_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; {command}"
NO_DESKTOP_EFFECT = frozenset({"wait", "terminate", "answer", "ask_user"})
DRAG_S = 0.5
LONG_PRESS_S = 1.0
TYPE_INTERVAL_S = 0.01
MAX_SCROLL_CLICKS = 50
PYAUTOGUI_MISTYPED = frozenset("<")

KEY_ALIASES = {
    "control": "ctrl",
    "return": "enter",
    "escape": "esc",
    "super": "win",
    "meta": "win",
    "cmd": "win",
    "command": "win",
    "windows": "win",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "page_up": "pageup",
    "page_down": "pagedown",
    "pgup": "pageup",
    "pgdn": "pagedown",
    "del": "delete",
    "ins": "insert",
    "spacebar": "space",
    "option": "alt",
}
NAMED_KEYS = frozenset(
    {
        "ctrl",
        "ctrlleft",
        "ctrlright",
        "shift",
        "shiftleft",
        "shiftright",
        "alt",
        "altleft",
        "altright",
        "win",
        "winleft",
        "winright",
        "enter",
        "esc",
        "tab",
        "space",
        "backspace",
        "delete",
        "insert",
        "home",
        "end",
        "pageup",
        "pagedown",
        "up",
        "down",
        "left",
        "right",
        "capslock",
        "numlock",
        "printscreen",
        "menu",
        "apps",
        "pause",
        "volumeup",
        "volumedown",
        "volumemute",
    }
)
BUTTON_KEYS = {"enter": ["enter"], "back": ["alt", "left"]}


class UnsupportedOnDesktop(ValueError):
    """The action has no meaning on a desktop (a direction-only swipe, an Android button)."""


def pyautogui_key(name: str) -> str:
    """A key name as pyautogui spells it; raises ``UnsupportedOnDesktop`` for an unknown one
    (pyautogui would silently press nothing)."""
    raw = name.strip()
    if len(raw) == 1 and raw.isascii() and raw.isprintable():
        return raw.lower() if raw.isalpha() else raw
    key = raw.lower().replace("-", "").replace(" ", "")
    key = KEY_ALIASES.get(key, KEY_ALIASES.get(raw.lower(), key))
    if key in NAMED_KEYS:
        return key
    if key.startswith("f") and key[1:].isdigit() and 1 <= int(key[1:]) <= 24:
        return key
    raise UnsupportedOnDesktop(f"no desktop key named {name!r}")


def python_command(call: str) -> list[str]:
    """The ``/execute`` argv that runs one pyautogui ``call`` (OSWorld's prefix)."""
    return ["python", "-c", PYAUTOGUI_PREFIX.format(command=call)]


def _type_commands(text: str) -> list[list[str]]:
    if not text:
        return []
    if text.isascii() and all(
        (ch.isprintable() or ch in "\n\t") and ch not in PYAUTOGUI_MISTYPED for ch in text
    ):
        return [python_command(f"pyautogui.write({text!r}, interval={TYPE_INTERVAL_S})")]
    return [["xdotool", "type", "--delay", "12", "--", text]]


def desktop_commands(action: Action, screen_w: int, screen_h: int) -> list[list[str]]:
    """``/execute`` argv lists that perform ``action`` on a ``screen_w`` × ``screen_h`` screen."""
    space = PixelSpace(screen_w, screen_h)

    def at(x: float, y: float) -> str:
        px, py = space.from_unit(x, y)
        return f"{px}, {py}"

    if action.type in NO_DESKTOP_EFFECT:
        return []
    if isinstance(action, Click):
        return [python_command(f"pyautogui.click({at(action.x, action.y)})")]
    if isinstance(action, DoubleClick):
        return [python_command(f"pyautogui.doubleClick({at(action.x, action.y)})")]
    if isinstance(action, TripleClick):
        return [python_command(f"pyautogui.tripleClick({at(action.x, action.y)})")]
    if isinstance(action, RightClick):
        return [python_command(f"pyautogui.rightClick({at(action.x, action.y)})")]
    if isinstance(action, MiddleClick):
        return [python_command(f"pyautogui.middleClick({at(action.x, action.y)})")]
    if isinstance(action, MouseMove):
        return [python_command(f"pyautogui.moveTo({at(action.x, action.y)})")]
    if isinstance(action, LongPress):
        seconds = LONG_PRESS_S if action.duration is None else action.duration
        point = at(action.x, action.y)
        return [
            python_command(
                f"pyautogui.mouseDown({point}); time.sleep({seconds}); pyautogui.mouseUp({point})"
            )
        ]
    if isinstance(action, Drag | Swipe):
        if action.x2 is None or action.y2 is None:
            raise UnsupportedOnDesktop("a desktop swipe needs an end point (x2, y2)")
        start = "" if action.x is None or action.y is None else at(action.x, action.y)
        move = f"pyautogui.moveTo({start}); " if start else ""
        end = at(action.x2, action.y2)
        return [python_command(f"{move}pyautogui.dragTo({end}, duration={DRAG_S}, button='left')")]
    if isinstance(action, Scroll):
        return _scroll_commands(action, space)
    if isinstance(action, TypeText):
        return _type_commands(action.text)
    if isinstance(action, Key):
        keys = [pyautogui_key(k) for k in action.keys]
        if len(keys) == 1:
            return [python_command(f"pyautogui.press({keys[0]!r})")]
        return [python_command(f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})")]
    if isinstance(action, SystemButton):
        if action.button not in BUTTON_KEYS:
            raise UnsupportedOnDesktop(f"a desktop has no {action.button!r} button")
        keys = BUTTON_KEYS[action.button]
        return [python_command(f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})")]
    raise UnsupportedOnDesktop(f"action {action.type!r} has no desktop equivalent here")


def _scroll_commands(action: Scroll, space: PixelSpace) -> list[list[str]]:
    """Wheel clicks as pyautogui counts them (positive ``dy`` up, positive ``dx`` right), each
    axis capped at ``MAX_SCROLL_CLICKS``; at (x, y) when given, else where the pointer is."""
    if action.dx == 0 and action.dy == 0:
        raise UnsupportedOnDesktop("a scroll needs a non-zero dx or dy")
    where = ""
    if action.x is not None and action.y is not None:
        px, py = space.from_unit(action.x, action.y)
        where = f", x={px}, y={py}"
    calls = []
    for clicks, fn in ((action.dy, "scroll"), (action.dx, "hscroll")):
        count = max(-MAX_SCROLL_CLICKS, min(MAX_SCROLL_CLICKS, round(clicks)))
        if count:
            calls.append(f"pyautogui.{fn}({count}{where})")
    if not calls:
        raise UnsupportedOnDesktop("a scroll of less than one wheel click")
    return [python_command("; ".join(calls))]
