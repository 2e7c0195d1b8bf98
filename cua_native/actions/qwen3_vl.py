"""Qwen3-VL dialect (QwenLM/Qwen3-VL cookbooks): Hermes ``<tool_call>`` blocks ⇄ canonical actions.

Reads ``mobile_use`` (all three published schema variants: cookbook utils with ``key``/``open``,
the notebook with ``answer``, MobileWorld with ``ask_user``) and ``computer_use`` (14 actions),
optionally preceded by thinking text ending in ``</think>`` and by ``Thought:``/``Action:`` lines
(``Action:`` → ``ParsedOutput.summary``; ``Thought:`` and thinking text → ``thought``). Any other
tool name is an MCP call, kept as a canonical ``tool_call``.

Mapping choices:
- mobile ``swipe`` ``coordinate`` + ``coordinate2`` → ``swipe`` with x, y, x2, y2 (no direction);
- ``system_button`` in any case → lowercase ``button``;
- mobile ``key`` (one adb key name in ``text``) → ``key`` with ``[text]``; computer ``keys`` as is;
- computer ``left_click`` → ``click``; ``left_click_drag`` (``coordinate`` = end) → ``drag`` with
  x, y ``None`` (the drag starts at the pointer);
- ``scroll`` / ``hscroll`` ``pixels`` → ``scroll`` ``dy`` / ``dx`` unchanged (Qwen's positive =
  up, canonical positive = up / right);
- ``wait`` ``time`` → ``seconds``; ``long_press`` ``time`` → ``duration``.

Coordinates: relative on a grid (999 for ``mobile_use``, 1000 for ``computer_use`` by default), or
with ``absolute_pixels=True`` (Qwen2.5-VL) pixels of the smart-resized image, which ``parse`` and
``format`` then need as ``image_size`` = (resized width, resized height).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cua_native.actions._arguments import CoordinateSpace, MissingSpace, Space, action_from_call
from cua_native.actions._lenient import (
    Failure,
    bare_call,
    calls_before,
    load_object,
    split_thinking,
    tool_call_blocks,
)
from cua_native.actions.coords import QWEN_COMPUTER_GRID, QWEN_MOBILE_GRID, PixelSpace
from cua_native.actions.errors import ParsedOutput, ParseError
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

MOBILE_USE = "mobile_use"
COMPUTER_USE = "computer_use"
TOOLS = (MOBILE_USE, COMPUTER_USE)
_GUI_TOOLS = frozenset(TOOLS)
_THINK_OPEN = ("<think>", "<thinking>")
_THINK_CLOSE = ("</think>", "</thinking>")
_THOUGHT = "Thought:"
_ACTION = "Action:"
_ACTION_LINE_RE = re.compile(r"^[ \t]*Action:", re.MULTILINE)
_QUOTE_PAIRS = frozenset({('"', '"'), ("'", "'"), ("“", "”")})
_COMPUTER_POINTERS: dict[type, str] = {
    Click: "left_click",
    DoubleClick: "double_click",
    TripleClick: "triple_click",
    RightClick: "right_click",
    MiddleClick: "middle_click",
    MouseMove: "mouse_move",
}


@dataclass(frozen=True, slots=True)
class Qwen3VLDialect:
    """Qwen3-VL's (and, with ``absolute_pixels``, Qwen2.5-VL's) GUI tool-call format.

    ``tool`` picks what ``format`` writes and the default grid; ``parse`` reads either tool.
    ``format`` raises ``ValueError`` for an action the tool cannot express.
    """

    tool: str = MOBILE_USE
    scale: int | None = None
    absolute_pixels: bool = False

    def __post_init__(self) -> None:
        if self.tool not in TOOLS:
            raise ValueError(f"tool must be one of {', '.join(TOOLS)}, got {self.tool!r}")
        if self.scale is not None and self.scale <= 0:
            raise ValueError(f"scale must be positive, got {self.scale}")

    @property
    def name(self) -> str:
        return "qwen2_5_vl" if self.absolute_pixels else "qwen3_vl"

    @property
    def grid_scale(self) -> int:
        if self.scale is not None:
            return self.scale
        return (QWEN_MOBILE_GRID if self.tool == MOBILE_USE else QWEN_COMPUTER_GRID).scale

    def coordinate_step(self, image_size: tuple[int, int] | None = None) -> float:
        """One unit of the model's space in normalized units: the round-trip tolerance."""
        if self.absolute_pixels and image_size is not None:
            return 1.0 / min(image_size)
        return 1.0 / self.grid_scale

    def _space(self, image_size: tuple[int, int] | None) -> Space:
        if not self.absolute_pixels:
            return CoordinateSpace(self.grid_scale, self.grid_scale, f"0-{self.grid_scale} grid")
        if image_size is None:
            return MissingSpace(
                "Qwen2.5-VL coordinates are absolute pixels: pass image_size=(width, height)"
                " of the resized image"
            )
        if len(image_size) != 2 or not all(isinstance(v, int | float) for v in image_size):
            return MissingSpace(f"image_size must be (width, height), got {image_size!r}"[:200])
        width, height = image_size
        if width <= 0 or height <= 0:
            return MissingSpace(f"image_size must be positive, got {width}x{height}")
        return CoordinateSpace(width, height, f"{width}x{height} image")

    def parse(self, text: str, *, image_size: tuple[int, int] | None = None) -> ParsedOutput:
        """Read one model output; never raises (failures are ``ParsedOutput.error`` values)."""
        if not isinstance(text, str):
            return _failed("format", f"model output must be a string, got {type(text).__name__}")
        warnings: list[str] = []
        thought: str | None = None
        summary: str | None = None
        try:
            space = self._space(tuple(image_size) if image_size is not None else None)  # type: ignore[arg-type]
            thinking = split_thinking(text.strip(), _THINK_OPEN, _THINK_CLOSE)
            head, body = _split_at_action_line(thinking.rest)
            blocks = tool_call_blocks(body)
            skipped = calls_before(thinking, warnings)
            line_thought, summary = _thought_and_action(
                head + blocks.prefix if blocks.bodies else ""
            )
            thought = _join(thinking.thought, line_thought)
            if blocks.bodies:
                call = load_object(body[blocks.first_start :], warnings)
                if not blocks.closed[0]:
                    warnings.append("<tool_call> not closed")
            else:
                found = bare_call(body, warnings)
                if found is None:
                    if not body.strip():
                        raise Failure("format", "empty output: no <tool_call> block")
                    raise Failure("format", "no <tool_call> block in the output")
                call = found
            action = action_from_call(call, _GUI_TOOLS, space, warnings)
            return ParsedOutput(
                action=action,
                thought=thought,
                summary=summary,
                extra_calls=max(0, len(blocks.bodies) - 1) + skipped,
                warnings=tuple(warnings),
            )
        except Failure as failure:
            return _failed(failure.kind, failure.message, thought, warnings, summary)
        except Exception as error:  # a parser bug must not take down a rollout
            return _failed("format", f"unexpected parser error: {type(error).__name__}: {error}")

    def format(
        self,
        action: Action,
        *,
        thought: str | None = None,
        summary: str | None = None,
        image_size: tuple[int, int] | None = None,
    ) -> str:
        """``Thought: …\\nAction: "…"\\n<tool_call>\\n{json}\\n</tool_call>`` (lines only when given).

        JSON as Qwen-Agent writes it: ``json.dumps`` default separators, ``ensure_ascii=False``.
        """
        if isinstance(action, ToolCall):
            if action.name in _GUI_TOOLS:
                raise ValueError(f"a tool_call may not be named {action.name!r}")
            call: dict[str, Any] = {"name": action.name, "arguments": action.arguments}
        else:
            point = self._point_writer(image_size)
            if self.tool == MOBILE_USE:
                args = _mobile_arguments(action, point)
            else:
                args = _computer_arguments(action, point)
            call = {"name": self.tool, "arguments": args}
        try:
            body = json.dumps(call, ensure_ascii=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"tool_call arguments are not JSON: {error}") from None
        head = ""
        if thought is not None:
            head += f"{_THOUGHT} {thought}\n"
        if summary is not None:
            head += f'{_ACTION} "{summary}"\n'
        return f"{head}<tool_call>\n{body}\n</tool_call>"

    def _point_writer(self, image_size: tuple[int, int] | None) -> _PointWriter:
        if not self.absolute_pixels:
            return _PointWriter(scale=self.grid_scale, pixels=None)
        if image_size is None:
            raise ValueError(
                "Qwen2.5-VL format needs image_size=(width, height) of the resized image"
            )
        return _PointWriter(scale=None, pixels=PixelSpace(*image_size))


@dataclass(frozen=True, slots=True)
class _PointWriter:
    scale: int | None
    pixels: PixelSpace | None

    def __call__(self, x: float, y: float) -> list[int]:
        if self.pixels is not None:
            return list(self.pixels.from_unit(x, y))
        assert self.scale is not None
        return [round(x * self.scale), round(y * self.scale)]


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def _mobile_arguments(action: Action, point: _PointWriter) -> dict[str, Any]:
    """``mobile_use`` arguments in the schema's key order (union of the three variants)."""
    if isinstance(action, Click):
        return {"action": "click", "coordinate": point(action.x, action.y)}
    if isinstance(action, LongPress):
        args: dict[str, Any] = {"action": "long_press", "coordinate": point(action.x, action.y)}
        if action.duration is not None:
            args["time"] = _number(action.duration)
        return args
    if isinstance(action, Swipe):
        if action.direction is not None or None in (action.x, action.y, action.x2, action.y2):
            raise ValueError("Qwen3-VL swipe needs start and end points and no direction")
        return {
            "action": "swipe",
            "coordinate": point(action.x, action.y),  # type: ignore[arg-type]
            "coordinate2": point(action.x2, action.y2),  # type: ignore[arg-type]
        }
    if isinstance(action, TypeText | Answer | AskUser):
        return {"action": action.type, "text": action.text}
    if isinstance(action, Key):
        if len(action.keys) != 1:
            raise ValueError(
                "mobile_use key presses one adb key; use computer_use for combinations"
            )
        return {"action": "key", "text": action.keys[0]}
    if isinstance(action, OpenApp):
        return {"action": "open", "text": action.name}
    if isinstance(action, SystemButton):
        return {"action": "system_button", "button": action.button.capitalize()}
    if isinstance(action, Wait):
        return _with_time({"action": "wait"}, action.seconds)
    if isinstance(action, Terminate):
        return {"action": "terminate", "status": action.status}
    raise ValueError(f"Qwen3-VL mobile_use has no {action.type} action")


def _computer_arguments(action: Action, point: _PointWriter) -> dict[str, Any]:
    """``computer_use`` arguments in the schema's key order."""
    pointer = _COMPUTER_POINTERS.get(type(action))
    if pointer is not None and isinstance(
        action, Click | DoubleClick | TripleClick | RightClick | MiddleClick | MouseMove
    ):
        return {"action": pointer, "coordinate": point(action.x, action.y)}
    if isinstance(action, Drag):
        if action.x is not None or action.y is not None:
            raise ValueError("computer_use left_click_drag starts at the pointer; move there first")
        return {"action": "left_click_drag", "coordinate": point(action.x2, action.y2)}
    if isinstance(action, Scroll):
        if action.dx and action.dy:
            raise ValueError("computer_use scrolls one axis at a time")
        args: dict[str, Any] = (
            {"action": "hscroll", "pixels": _number(action.dx)}
            if action.dx
            else {"action": "scroll", "pixels": _number(action.dy)}
        )
        if action.x is not None and action.y is not None:
            args["coordinate"] = point(action.x, action.y)
        return args
    if isinstance(action, Key):
        return {"action": "key", "keys": list(action.keys)}
    if isinstance(action, TypeText | Answer):
        return {"action": action.type, "text": action.text}
    if isinstance(action, Wait):
        return _with_time({"action": "wait"}, action.seconds)
    if isinstance(action, Terminate):
        return {"action": "terminate", "status": action.status}
    raise ValueError(f"Qwen3-VL computer_use has no {action.type} action")


def _with_time(args: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    if seconds is not None:
        args["time"] = _number(seconds)
    return args


def _split_at_action_line(text: str) -> tuple[str, str]:
    """``(head, body)``: the action is read from ``body``, the text from the first line that
    starts with ``Action:`` on, when a ``<tool_call>`` follows that line (the
    ``Thought:``/``Action:``/``<tool_call>`` layout of the cookbook and MobileWorld prompts).

    Everything before that line is reasoning: a ``<tool_call>`` written or named in the
    ``Thought:`` text is neither the action nor the end of the thought (as MobileWorld reads it).
    Without such a line the whole text is the body.
    """
    line = _ACTION_LINE_RE.search(text)
    if line is None or not tool_call_blocks(text[line.end() :]).bodies:
        return "", text
    return text[: line.start()], text[line.start() :]


def _thought_and_action(prefix: str) -> tuple[str | None, str | None]:
    """``Thought:`` and ``Action:`` lines before the first tool call; free text is a thought.

    The ``Action:`` marker is the first one that starts a line (``Thought: the Action: button``
    keeps its text), else the first anywhere (``Thought: … Action: … <tool_call>`` on one line).
    Each value loses one pair of wrapping quotes (``"…"``, ``'…'``, ``“…”``), never a quote on
    one end only: ``Action: Type 'hello'`` keeps its text.
    """
    thought_at = prefix.find(_THOUGHT)
    line = _ACTION_LINE_RE.search(prefix)
    action_at = prefix.find(_ACTION, line.start()) if line is not None else prefix.find(_ACTION)
    summary: str | None = None
    if action_at >= 0:
        summary = unquote(prefix[action_at + len(_ACTION) :])
    if thought_at >= 0:
        end = action_at if action_at > thought_at else len(prefix)
        return unquote(prefix[thought_at + len(_THOUGHT) : end]), summary
    if action_at >= 0:
        return unquote(prefix[:action_at]), summary
    return unquote(prefix), summary


def unquote(text: str) -> str | None:
    """``text`` stripped, without one pair of matching wrapping quotes; empty → ``None``."""
    text = text.strip()
    if len(text) >= 2 and (text[0], text[-1]) in _QUOTE_PAIRS:
        text = text[1:-1].strip()
    return text or None


def _join(first: str | None, second: str | None) -> str | None:
    if first and second:
        return f"{first}\n{second}"
    return first or second


def _failed(
    kind: Any,
    message: str,
    thought: str | None = None,
    warnings: list[str] | None = None,
    summary: str | None = None,
) -> ParsedOutput:
    return ParsedOutput(
        error=ParseError(kind=kind, message=message),
        thought=thought,
        summary=summary,
        warnings=tuple(warnings or ()),
    )
