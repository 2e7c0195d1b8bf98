"""GUI tool arguments (``{"action": "click", "coordinate": [x, y], ...}``) → canonical actions.

One table serves both dialects: MAI-UI's ``mobile_use``, Qwen3-VL's ``mobile_use`` (all three
published schema variants) and ``computer_use`` share most action names, and the few
differences (``key`` with ``text`` or ``keys``, ``scroll`` with ``pixels`` or a direction) are
told apart by their arguments. Known synonyms are accepted with a warning.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from cua_native.actions._lenient import Failure, load_object
from cua_native.actions.models import (
    Action,
    Answer,
    AskUser,
    Click,
    DoubleClick,
    Drag,
    Key,
    LongPress,
    MiddleClick,
    MouseMove,
    OpenApp,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    ToolCall,
    TripleClick,
    TypeText,
    Wait,
)

_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_MAX_POINT_TEXT = 200


@dataclass(frozen=True, slots=True)
class CoordinateSpace:
    """The space a model writes points in: an integer grid, or pixels of the resized image.

    Values slightly outside (within 1% or one unit) are clamped with a warning; anything further
    out is a ``tool_arg`` error, e.g. absolute pixels leaking into a relative model.
    """

    width: float
    height: float
    description: str

    def to_unit(self, value: Any, what: str, warnings: list[str]) -> tuple[float, float]:
        x, y = point_numbers(value, what, warnings)
        if 0.0 <= x <= 1.0 and 0.0 <= y <= 1.0 and not (x.is_integer() and y.is_integer()):
            warnings.append(f"{what} [{x:g}, {y:g}] read as already normalized to [0, 1]")
            return x, y
        return self._axis(x, self.width, what, (x, y), warnings), self._axis(
            y, self.height, what, (x, y), warnings
        )

    def _axis(
        self, value: float, size: float, what: str, point: tuple[float, float], warnings: list[str]
    ) -> float:
        if 0.0 <= value <= size:
            return value / size
        tolerance = max(1.0, 0.01 * size)
        if -tolerance <= value <= size + tolerance:
            warnings.append(
                f"{what} [{point[0]:g}, {point[1]:g}] clamped to the {self.description}"
            )
            return 0.0 if value < 0 else 1.0
        raise Failure(
            "tool_arg",
            f"{what} [{point[0]:g}, {point[1]:g}] is outside the {self.description}"
            " (absolute pixels given to a relative model?)",
        )


@dataclass(frozen=True, slots=True)
class MissingSpace:
    """Stands in when pixel coordinates cannot be mapped because the image size is unknown."""

    reason: str

    def to_unit(self, value: Any, what: str, warnings: list[str]) -> tuple[float, float]:
        raise Failure("tool_arg", self.reason)


Space = CoordinateSpace | MissingSpace


def number(value: Any, what: str, warnings: list[str]) -> float:
    """A finite number; numeric strings are accepted with a warning."""
    if isinstance(value, bool):
        raise Failure("tool_arg", f"{what} must be a number, got {value!r}")
    if isinstance(value, int | float):
        try:
            result = float(value)
        except OverflowError:
            raise Failure("tool_arg", f"{what} is too large") from None
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise Failure("tool_arg", f"{what} must be a number, got {value[:40]!r}") from None
        warnings.append(f"{what} given as a string")
    else:
        raise Failure("tool_arg", f"{what} must be a number, got {type(value).__name__}")
    if not math.isfinite(result):
        raise Failure("tool_arg", f"{what} must be finite, got {value!r}")
    return result


def point_numbers(value: Any, what: str, warnings: list[str]) -> tuple[float, float]:
    """``[x, y]`` from the shapes models write: lists, bboxes (centre), strings, ``{x, y}``."""
    if isinstance(value, dict):
        lowered = {str(k).lower(): v for k, v in value.items()}
        if "x" in lowered and "y" in lowered:
            warnings.append(f"{what} given as an object")
            return number(lowered["x"], f"{what} x", warnings), number(
                lowered["y"], f"{what} y", warnings
            )
        raise Failure("tool_arg", f"{what} must be [x, y], got an object without x and y")
    if isinstance(value, str):
        found = _NUMBER_RE.findall(value[:_MAX_POINT_TEXT])
        warnings.append(f"{what} given as a string")
        values: list[Any] = found
    elif isinstance(value, list | tuple):
        values = list(value)
        if len(values) == 1 and isinstance(values[0], list | tuple | dict | str):
            warnings.append(f"{what} nested in an extra list")
            return point_numbers(values[0], what, warnings)
        if len(values) == 2 and all(isinstance(v, list | tuple) for v in values):
            warnings.append(f"{what} given as two corner points; using the centre")
            (x1, y1), (x2, y2) = (point_numbers(v, what, warnings) for v in values)
            return (x1 + x2) / 2, (y1 + y2) / 2
    elif value is None:
        raise Failure("tool_arg", f"{what} is missing")
    else:
        raise Failure("tool_arg", f"{what} must be [x, y], got {type(value).__name__}")
    numbers = [number(v, what, warnings) for v in values]
    if len(numbers) == 2:
        return numbers[0], numbers[1]
    if len(numbers) == 4:
        warnings.append(f"{what} given as a box; using its centre")
        return (numbers[0] + numbers[2]) / 2, (numbers[1] + numbers[3]) / 2
    raise Failure(
        "tool_arg", f"{what} must be [x, y] (or a 4-number box), got {len(numbers)} numbers"
    )


def _first(args: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = args.get(key)
        if value is not None:
            return value
    return None


def _text(args: dict[str, Any], action: str, warnings: list[str], *keys: str) -> str:
    value = _first(args, *keys)
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        warnings.append(f"{action} text given as a number")
        return str(value)
    if value is None:
        raise Failure("tool_arg", f'{action} needs a "{keys[0]}" string')
    raise Failure("tool_arg", f'{action} "{keys[0]}" must be a string, got {type(value).__name__}')


def _optional_number(
    args: dict[str, Any], what: str, warnings: list[str], *keys: str
) -> float | None:
    value = _first(args, *keys)
    return None if value is None else number(value, what, warnings)


def _point(
    args: dict[str, Any], space: Space, action: str, warnings: list[str]
) -> dict[str, float]:
    value = _first(args, "coordinate", "coordinates", "point", "position", "coords")
    if value is None and "x" in args and "y" in args:
        value = {"x": args["x"], "y": args["y"]}
    if value is None:
        raise Failure("tool_arg", f'{action} needs a "coordinate" [x, y]')
    x, y = space.to_unit(value, f"{action} coordinate", warnings)
    return {"x": x, "y": y}


_START_KEYS = ("start_coordinate", "coordinate1", "start", "start_point", "from")
_END_KEYS = ("end_coordinate", "coordinate2", "end", "end_point", "to")


def _build(cls: type[BaseModel], action: str, **fields: Any) -> Action:
    try:
        return cls(**fields)  # type: ignore[return-value]
    except ValidationError as error:
        detail = error.errors()[0]
        where = ".".join(str(p) for p in detail.get("loc", ())) or "arguments"
        raise Failure("tool_arg", f"{action} {where}: {detail.get('msg', 'invalid')}") from None


def _pointer(cls: type[BaseModel]) -> Callable[[dict[str, Any], Space, str, list[str]], Action]:
    def read(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
        return _build(cls, action, **_point(args, space, action, warnings))

    return read


def _press(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    """``press`` is a click with a coordinate and a key press with keys."""
    if _first(args, "keys", "key") is not None or ("text" in args and "coordinate" not in args):
        return _key(args, space, action, warnings)
    return _build(Click, action, **_point(args, space, action, warnings))


def _long_press(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    duration = _optional_number(args, f"{action} time", warnings, "time", "duration")
    return _build(LongPress, action, duration=duration, **_point(args, space, action, warnings))


def _drag(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    """``drag`` (start and end) or ``left_click_drag`` (``coordinate`` = end, start = pointer)."""
    end = _first(args, *_END_KEYS)
    start = _first(args, *_START_KEYS)
    if end is None:
        end, start = _first(args, "coordinate"), start
    elif start is None:
        start = _first(args, "coordinate")
    if end is None:
        raise Failure("tool_arg", f'{action} needs an end point ("end_coordinate" or "coordinate")')
    x2, y2 = space.to_unit(end, f"{action} end", warnings)
    x, y = space.to_unit(start, f"{action} start", warnings) if start is not None else (None, None)
    return _build(Drag, action, x=x, y=y, x2=x2, y2=y2)


_DIRECTIONS = {"up", "down", "left", "right"}
_REVERSED = {"up": "down", "down": "up", "left": "right", "right": "left"}


def _swipe(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    """A finger swipe: a direction and an optional start (MAI-UI) or start and end (Qwen)."""
    raw_direction = _first(args, "direction")
    direction: str | None = None
    if raw_direction is not None:
        direction = str(raw_direction).strip().lower()
        if direction not in _DIRECTIONS:
            raise Failure(
                "tool_arg",
                f"{action} direction must be up, down, left or right, got {raw_direction!r}",
            )
        if action == "scroll":
            # MobileWorld's convention for the same action space: content scrolls the opposite way
            # to the finger, so "scroll down" is a finger swipe up.
            warnings.append(f"{action} {direction} read as a finger swipe {_REVERSED[direction]}")
            direction = _REVERSED[direction]
    start = _first(args, "coordinate", *_START_KEYS)
    end = _first(args, *_END_KEYS)
    if direction is None and end is None:
        raise Failure("tool_arg", f"{action} needs a direction or coordinate2")
    if end is not None and start is None:
        raise Failure("tool_arg", f'{action} with an end point needs a start "coordinate"')
    x, y = space.to_unit(start, f"{action} start", warnings) if start is not None else (None, None)
    x2, y2 = space.to_unit(end, f"{action} end", warnings) if end is not None else (None, None)
    return _build(Swipe, action, direction=direction, x=x, y=y, x2=x2, y2=y2)


def _scroll(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    """``scroll``/``hscroll`` with ``pixels`` (+ = up / right) is a wheel scroll; else a swipe."""
    pixels = _first(args, "pixels", "amount", "delta")
    if pixels is None:
        return _swipe(args, space, action, warnings)
    amount = number(pixels, f"{action} pixels", warnings)
    where = _first(args, "coordinate", "point", "position")
    x, y = (
        space.to_unit(where, f"{action} coordinate", warnings)
        if where is not None
        else (None, None)
    )
    if action == "hscroll":
        return _build(Scroll, action, dx=amount, dy=0.0, x=x, y=y)
    return _build(Scroll, action, dx=0.0, dy=amount, x=x, y=y)


def _type(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    return _build(TypeText, action, text=_text(args, action, warnings, "text", "content", "value"))


def _key(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    """``keys`` list (computer_use) or one adb key name in ``text`` (mobile_use)."""
    value = _first(args, "keys", "key", "text")
    if isinstance(value, str):
        parts = value.split("+")
        keys = parts if len(parts) > 1 and all(parts) else [value]
    elif isinstance(value, list) and all(isinstance(k, str) for k in value):
        keys = list(value)
    elif value is None:
        raise Failure("tool_arg", f'{action} needs "keys" (a list of key names) or "text"')
    else:
        raise Failure("tool_arg", f"{action} keys must be key names, got {value!r}"[:200])
    return _build(Key, action, keys=[k.strip() for k in keys if k.strip()])


_BUTTON_SYNONYMS = {"back": "back", "home": "home", "menu": "menu", "enter": "enter"}
_BUTTON_ACTIONS = {"navigate_back": "back", "navigate_home": "home", "keyboard_enter": "enter"}


def _system_button(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    if action in _BUTTON_ACTIONS:
        return _build(SystemButton, action, button=_BUTTON_ACTIONS[action])
    raw = _first(args, "button", "key", "text")
    if raw is None:
        raise Failure("tool_arg", f'{action} needs a "button" (back, home, menu or enter)')
    button = _BUTTON_SYNONYMS.get(str(raw).strip().lower())
    if button is None:
        raise Failure("tool_arg", f"{action} button must be back, home, menu or enter, got {raw!r}")
    return _build(SystemButton, action, button=button)


def _open(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    name = _text(args, action, warnings, "text", "app_name", "app", "name", "package")
    return _build(OpenApp, action, name=name.strip())


def _wait(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    seconds = _optional_number(args, f"{action} time", warnings, "time", "seconds", "duration")
    return _build(Wait, action, seconds=seconds)


_SUCCESS = frozenset({"success", "succeed", "succeeded", "successful", "completed", "complete"})
_FAILURE = frozenset({"fail", "failure", "failed", "infeasible", "impossible", "unsuccessful"})


def _terminate(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    raw = _first(args, "status", "result")
    if isinstance(raw, list) and len(raw) == 1:
        warnings.append(f"{action} status given as a list")
        raw = raw[0]
    if raw is None:
        raise Failure("tool_arg", f'{action} needs a "status" (success or failure)')
    status = str(raw).strip().lower()
    if status in _SUCCESS:
        result = "success"
    elif status in _FAILURE:
        result = "failure"
    else:
        raise Failure("tool_arg", f"{action} status must be success or failure, got {raw!r}"[:200])
    if status != result:
        warnings.append(f"{action} status {raw!r} read as {result!r}")
    return _build(Terminate, action, status=result)


def _answer(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    return _build(Answer, action, text=_text(args, action, warnings, "text", "answer", "content"))


def _ask_user(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    text = _text(args, action, warnings, "text", "question", "content")
    return _build(AskUser, action, text=text)


def _mcp_tool(args: dict[str, Any], space: Space, action: str, warnings: list[str]) -> Action:
    """MAI-UI's agent-memory shape ``{"action": "mcp_tool", "tool_name": ..., <args>}``."""
    name = args.get("tool_name")
    if not isinstance(name, str) or not name.strip():
        raise Failure("tool_name", 'mcp_tool action needs a "tool_name"')
    rest = {k: v for k, v in args.items() if k not in ("action", "action_type", "tool_name")}
    return _build(ToolCall, action, name=name.strip(), arguments=rest)


Reader = Callable[[dict[str, Any], Space, str, list[str]], Action]

ACTION_READERS: dict[str, Reader] = {
    "click": _pointer(Click),
    "left_click": _pointer(Click),
    "double_click": _pointer(DoubleClick),
    "triple_click": _pointer(TripleClick),
    "right_click": _pointer(RightClick),
    "middle_click": _pointer(MiddleClick),
    "mouse_move": _pointer(MouseMove),
    "long_press": _long_press,
    "drag": _drag,
    "left_click_drag": _drag,
    "swipe": _swipe,
    "scroll": _scroll,
    "hscroll": _scroll,
    "type": _type,
    "key": _key,
    "system_button": _system_button,
    "open": _open,
    "wait": _wait,
    "terminate": _terminate,
    "answer": _answer,
    "ask_user": _ask_user,
    "mcp_tool": _mcp_tool,
}
"""Published action names of MAI-UI and Qwen3-VL (mobile_use and computer_use)."""

SYNONYMS: dict[str, str] = {
    "tap": "click",
    "press": "press",
    "double_tap": "double_click",
    "long_click": "long_press",
    "move": "mouse_move",
    "hover": "mouse_move",
    "input_text": "type",
    "input": "type",
    "type_text": "type",
    "press_key": "key",
    "hotkey": "key",
    "keypress": "key",
    "open_app": "open",
    "launch": "open",
    "launch_app": "open",
    "press_button": "system_button",
    "navigate_back": "navigate_back",
    "navigate_home": "navigate_home",
    "keyboard_enter": "keyboard_enter",
    "fling": "swipe",
    "finish": "terminate",
    "finished": "terminate",
    "done": "terminate",
    "sleep": "wait",
}
"""Names models write instead of the published ones (item 9 of the malformed-output cases, ``tests/fixtures/malformed.jsonl``)."""

_SPECIAL: dict[str, Reader] = {
    "press": _press,
    "navigate_back": _system_button,
    "navigate_home": _system_button,
    "keyboard_enter": _system_button,
}

KNOWN_ACTION_NAMES = frozenset(ACTION_READERS) | frozenset(SYNONYMS)


def normalize_name(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(" ", "_")


def action_from_arguments(args: dict[str, Any], space: Space, warnings: list[str]) -> Action:
    """The canonical action for one GUI tool call's ``arguments``; raises ``Failure``."""
    raw = _first(args, "action", "action_type")
    if raw is None:
        raise Failure("tool_name", 'the call has no "action"')
    if "action" not in args:
        warnings.append('"action_type" used instead of "action"')
    if not isinstance(raw, str):
        raise Failure("tool_name", f'"action" must be a string, got {type(raw).__name__}')
    name = normalize_name(raw)
    reader = ACTION_READERS.get(name)
    if reader is None and name in SYNONYMS:
        canonical = SYNONYMS[name]
        reader = _SPECIAL.get(canonical) or ACTION_READERS[canonical]
        warnings.append(f"action {raw!r} read as {canonical!r}")
        if canonical in ACTION_READERS and canonical != "scroll":
            name = canonical
    if reader is None:
        known = ", ".join(sorted(ACTION_READERS))
        raise Failure("tool_name", f"unknown action {raw[:40]!r}; known actions: {known}")
    return reader(args, space, name, warnings)


def decode_arguments(value: Any, warnings: list[str]) -> dict[str, Any]:
    """``arguments`` as an object; a JSON string (OpenAI ``tool_calls`` style) is decoded."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        warnings.append('"arguments" given as a JSON string')
        return load_object(value, warnings, what="arguments string")
    if value is None:
        raise Failure("tool_arg", 'the call has no "arguments" object')
    raise Failure("tool_arg", f'"arguments" must be an object, got {type(value).__name__}')


def action_from_call(
    call: dict[str, Any], gui_tools: frozenset[str], space: Space, warnings: list[str]
) -> Action:
    """The canonical action for one ``{"name": ..., "arguments": {...}}`` object.

    ``name`` in ``gui_tools`` → a GUI action; ``name`` that is itself an action (``"click"``) with
    no ``action`` argument → that action; bare arguments without a name → a GUI action; any other
    name → a ``tool_call`` kept under its own name (MCP tools).
    """
    function = call.get("function")
    if isinstance(function, dict) and "name" in function:
        warnings.append('call wrapped in a "function" object')
        call = function
    name = call.get("name")
    if name is None:
        if "action" in call or "action_type" in call:
            warnings.append("arguments written without a tool name")
            return action_from_arguments(call, space, warnings)
        raise Failure("tool_name", 'the tool call has no "name"')
    if not isinstance(name, str) or not name.strip():
        raise Failure("tool_name", f"the tool name must be a non-empty string, got {name!r}"[:200])
    raw_args = call.get("arguments", call.get("parameters"))
    normalized = normalize_name(name)
    if normalized in gui_tools:
        return action_from_arguments(decode_arguments(raw_args, warnings), space, warnings)
    args = {} if raw_args is None else decode_arguments(raw_args, warnings)
    if normalized in KNOWN_ACTION_NAMES and "action" not in args and "action_type" not in args:
        warnings.append(f"action {name!r} written as the tool name")
        return action_from_arguments({**args, "action": name}, space, warnings)
    return _build(ToolCall, "tool call", name=name.strip(), arguments=args)
