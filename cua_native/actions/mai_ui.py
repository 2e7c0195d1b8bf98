"""MAI-UI dialect (Tongyi-MAI/MAI-UI): navigation and grounding outputs ⇄ canonical actions.

Navigation output: ``<thinking>…</thinking>`` (or a bare ``…</think>``), then
``<tool_call>{"name": "mobile_use", "arguments": {"action": ...}}</tool_call>``; any other
top-level name is an MCP call, kept as a canonical ``tool_call`` under its own name (the
reference parser drops the name). Grounding output:
``<grounding_think>…</grounding_think><answer>{"coordinate": [x, y]}</answer>`` → ``click``;
``mai_ui`` reads both forms (an output with ``<answer>`` or ``<grounding_think>`` and no
``<tool_call>`` is grounding output), ``mai_ui_grounding`` is the same parser whose ``format``
writes the grounding form.
Points are integers on the 0–999 grid of the screenshot the model saw (``MAI_GRID``); a
4-number box is reduced to its centre.

``format`` writes the reference agent's history style, with two of its bugs left out: drag
start/end go back onto the grid (the reference leaves them as floats) and MCP calls keep their
name. Grid values are rounded, not truncated, so ``parse(format(a))`` is within one grid step.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from cua_native.actions._arguments import CoordinateSpace, action_from_call, point_numbers
from cua_native.actions._lenient import (
    Failure,
    bare_call,
    calls_before,
    clean_thought,
    load_object,
    split_thinking,
    tool_call_blocks,
)
from cua_native.actions.coords import MAI_GRID, Grid
from cua_native.actions.errors import ParsedOutput, ParseError
from cua_native.actions.models import (
    Action,
    Answer,
    AskUser,
    Click,
    DoubleClick,
    Drag,
    LongPress,
    OpenApp,
    Swipe,
    SystemButton,
    Terminate,
    ToolCall,
    TypeText,
    Wait,
)

TOOL_NAME = "mobile_use"
_GUI_TOOLS = frozenset({TOOL_NAME})
_THINK_OPEN = ("<thinking>", "<think>")
_THINK_CLOSE = ("</thinking>", "</think>")
_GROUNDING_OPEN = "<grounding_think>"
_GROUNDING_CLOSE = "</grounding_think>"
_ANSWER_OPEN = "<answer>"
_ANSWER_CLOSE = "</answer>"
_TOOL_CALL_RE = re.compile(r"<\s*tool_call\s*>", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class MaiUiDialect:
    """MAI-UI's output format; ``grounding=True`` reads and writes the single-step grounding form.

    ``format`` ignores ``summary`` (MAI-UI has no summary line) and raises ``ValueError`` for an
    action MAI-UI cannot express (e.g. ``scroll``, a Qwen-style two-point ``swipe``, or a
    ``long_press`` duration).
    """

    grounding: bool = False
    scale: int = MAI_GRID.scale

    def __post_init__(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"scale must be positive, got {self.scale}")

    @property
    def name(self) -> str:
        return "mai_ui_grounding" if self.grounding else "mai_ui"

    def coordinate_step(self, image_size: tuple[int, int] | None = None) -> float:
        """One grid step in normalized units: the round-trip tolerance."""
        return 1.0 / self.scale

    def parse(self, text: str, *, image_size: tuple[int, int] | None = None) -> ParsedOutput:
        """Read one model output; never raises (failures are ``ParsedOutput.error`` values)."""
        if not isinstance(text, str):
            return _failed("format", f"model output must be a string, got {type(text).__name__}")
        warnings: list[str] = []
        thought: str | None = None
        space = CoordinateSpace(self.scale, self.scale, f"0-{self.scale} grid")
        try:
            if self.grounding or is_grounding_output(text):
                thought = _grounding_thought(text)
                action = _grounding_action(text, space, warnings)
                return ParsedOutput(action=action, thought=thought, warnings=tuple(warnings))
            thinking = split_thinking(text.strip(), _THINK_OPEN, _THINK_CLOSE)
            thought = thinking.thought
            blocks = tool_call_blocks(thinking.rest)
            skipped = calls_before(thinking, warnings)
            if thought is None and blocks.bodies:
                thought = clean_thought(blocks.prefix)
            if blocks.bodies:
                call = load_object(thinking.rest[blocks.first_start :], warnings)
                if not blocks.closed[0]:
                    warnings.append("<tool_call> not closed")
            else:
                found = bare_call(thinking.rest, warnings)
                if found is None:
                    raise Failure("format", _no_call_message(thinking.rest))
                call = found
            action = action_from_call(call, _GUI_TOOLS, space, warnings)
            extra = max(0, len(blocks.bodies) - 1) + skipped
            return ParsedOutput(
                action=action, thought=thought, extra_calls=extra, warnings=tuple(warnings)
            )
        except Failure as failure:
            return _failed(failure.kind, failure.message, thought, warnings)
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
        """The action as MAI-UI writes it (history style); ``ValueError`` if not expressible."""
        grid = Grid(self.scale)
        if self.grounding:
            if not isinstance(action, Click):
                raise ValueError(f"MAI-UI grounding writes only click, not {action.type}")
            answer = json.dumps(
                {"coordinate": _grid_point(grid, action.x, action.y)}, separators=(",", ":")
            )
            think = "" if thought is None else f"{_GROUNDING_OPEN}\n{thought}\n{_GROUNDING_CLOSE}\n"
            return f"{think}{_ANSWER_OPEN}\n{answer}\n{_ANSWER_CLOSE}"
        if isinstance(action, ToolCall):
            if action.name in _GUI_TOOLS:
                raise ValueError(f"a tool_call may not be named {action.name!r}")
            call: dict[str, Any] = {"name": action.name, "arguments": action.arguments}
        else:
            call = {"name": TOOL_NAME, "arguments": _arguments(action, grid)}
        try:
            body = json.dumps(call, separators=(",", ":"), ensure_ascii=True)
        except (TypeError, ValueError) as error:
            raise ValueError(f"tool_call arguments are not JSON: {error}") from None
        return f"<thinking>\n{thought or ''}\n</thinking>\n<tool_call>\n{body}\n</tool_call>"


def _failed(
    kind: Any, message: str, thought: str | None = None, warnings: list[str] | None = None
) -> ParsedOutput:
    return ParsedOutput(
        error=ParseError(kind=kind, message=message),
        thought=thought,
        warnings=tuple(warnings or ()),
    )


def _no_call_message(rest: str) -> str:
    if not rest.strip():
        return "empty output: no <tool_call> block"
    return "no <tool_call> block in the output"


def is_grounding_output(text: str) -> bool:
    """MAI-UI grounding output (``<answer>`` or ``<grounding_think>``, no ``<tool_call>``)."""
    if _TOOL_CALL_RE.search(text) is not None:
        return False
    return _ANSWER_OPEN in text or _GROUNDING_OPEN in text


def _grounding_thought(text: str) -> str | None:
    start = text.find(_GROUNDING_OPEN)
    if start < 0:
        return None
    start += len(_GROUNDING_OPEN)
    end = text.find(_GROUNDING_CLOSE, start)
    if end < 0:
        end = text.find(_ANSWER_OPEN, start)
    return clean_thought(text[start:] if end < 0 else text[start:end])


def _grounding_action(text: str, space: CoordinateSpace, warnings: list[str]) -> Action:
    start = text.find(_ANSWER_OPEN)
    if start < 0:
        if text.find(_GROUNDING_OPEN) >= 0 and text.find(_GROUNDING_CLOSE) < 0:
            raise Failure("format", "output ends inside <grounding_think> (truncated?)")
        raise Failure("format", "no <answer> block in the grounding output")
    start += len(_ANSWER_OPEN)
    end = text.find(_ANSWER_CLOSE, start)
    if end < 0:
        warnings.append("<answer> not closed")
    body = (text[start:] if end < 0 else text[start:end]).strip()
    if not body:
        raise Failure("format", "empty <answer> block")
    if "{" in body:
        answer = load_object(body, warnings, what="answer JSON")
        point = answer.get("coordinate", answer.get("point", answer.get("position")))
        if point is None:
            raise Failure("tool_arg", 'grounding answer needs a "coordinate" [x, y]')
    else:
        point_numbers(body, "grounding answer", [])  # fail early with a clear message
        point = body
    x, y = space.to_unit(point, "grounding coordinate", warnings)
    return Click(x=x, y=y)


def _grid_point(grid: Grid, x: float, y: float) -> list[int]:
    return [grid.from_unit(x), grid.from_unit(y)]


def _arguments(action: Action, grid: Grid) -> dict[str, Any]:
    """``arguments`` in the key order of MAI-UI's action space."""
    if isinstance(action, Click | DoubleClick):
        return {"action": action.type, "coordinate": _grid_point(grid, action.x, action.y)}
    if isinstance(action, LongPress):
        if action.duration is not None:
            raise ValueError("MAI-UI long_press has no duration")
        return {"action": "long_press", "coordinate": _grid_point(grid, action.x, action.y)}
    if isinstance(action, TypeText | Answer | AskUser):
        return {"action": action.type, "text": action.text}
    if isinstance(action, Swipe):
        if action.direction is None or action.x2 is not None or action.y2 is not None:
            raise ValueError("MAI-UI swipe is a direction with an optional start point")
        args: dict[str, Any] = {"action": "swipe", "direction": action.direction}
        if action.x is not None and action.y is not None:
            args["coordinate"] = _grid_point(grid, action.x, action.y)
        return args
    if isinstance(action, OpenApp):
        return {"action": "open", "text": action.name}
    if isinstance(action, Drag):
        if action.x is None or action.y is None:
            raise ValueError("MAI-UI drag needs a start point")
        return {
            "action": "drag",
            "start_coordinate": _grid_point(grid, action.x, action.y),
            "end_coordinate": _grid_point(grid, action.x2, action.y2),
        }
    if isinstance(action, SystemButton):
        return {"action": "system_button", "button": action.button}
    if isinstance(action, Wait):
        if action.seconds is not None:
            raise ValueError("MAI-UI wait takes no duration")
        return {"action": "wait"}
    if isinstance(action, Terminate):
        return {
            "action": "terminate",
            "status": "success" if action.status == "success" else "fail",
        }
    raise ValueError(f"MAI-UI has no {action.type} action")
