"""Canonical actions: the one vocabulary inside cua_native (``docs/actions.md``).

Coordinates are floats in [0, 1] relative to the screenshot the model saw (x right, y down).
Dialects translate model text to these models; environments execute them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Unit = Annotated[float, Field(ge=0.0, le=1.0)]
"""A normalized coordinate in [0, 1]."""

Direction = Literal["up", "down", "left", "right"]
Button = Literal["back", "home", "menu", "enter"]
Status = Literal["success", "failure"]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Point(_Action):
    x: Unit
    y: Unit


class Click(_Point):
    type: Literal["click"] = "click"


class DoubleClick(_Point):
    type: Literal["double_click"] = "double_click"


class TripleClick(_Point):
    type: Literal["triple_click"] = "triple_click"


class RightClick(_Point):
    type: Literal["right_click"] = "right_click"


class MiddleClick(_Point):
    type: Literal["middle_click"] = "middle_click"


class MouseMove(_Point):
    type: Literal["mouse_move"] = "mouse_move"


class LongPress(_Point):
    type: Literal["long_press"] = "long_press"
    duration: Annotated[float, Field(ge=0.0)] | None = None


class Drag(_Action):
    """Press at (x, y) (``None`` = the current pointer) and release at (x2, y2)."""

    type: Literal["drag"] = "drag"
    x: Unit | None = None
    y: Unit | None = None
    x2: Unit
    y2: Unit


class Swipe(_Action):
    """A finger swipe: MAI-UI gives a direction and an optional start, Qwen start and end."""

    type: Literal["swipe"] = "swipe"
    direction: Direction | None = None
    x: Unit | None = None
    y: Unit | None = None
    x2: Unit | None = None
    y2: Unit | None = None


class Scroll(_Action):
    """Mouse-wheel scroll in pixels; positive ``dx`` = right, positive ``dy`` = up."""

    type: Literal["scroll"] = "scroll"
    dx: float = 0.0
    dy: float = 0.0
    x: Unit | None = None
    y: Unit | None = None


class TypeText(_Action):
    type: Literal["type"] = "type"
    text: str


class Key(_Action):
    type: Literal["key"] = "key"
    keys: Annotated[list[str], Field(min_length=1)]


class SystemButton(_Action):
    type: Literal["system_button"] = "system_button"
    button: Button


class OpenApp(_Action):
    type: Literal["open_app"] = "open_app"
    name: Annotated[str, Field(min_length=1)]


class Wait(_Action):
    type: Literal["wait"] = "wait"
    seconds: Annotated[float, Field(ge=0.0)] | None = None


class Terminate(_Action):
    type: Literal["terminate"] = "terminate"
    status: Status


class Answer(_Action):
    type: Literal["answer"] = "answer"
    text: str


class AskUser(_Action):
    type: Literal["ask_user"] = "ask_user"
    text: str


class ToolCall(_Action):
    """Any other named tool (e.g. an MCP tool), kept by name."""

    type: Literal["tool_call"] = "tool_call"
    name: Annotated[str, Field(min_length=1)]
    arguments: dict[str, Any] = Field(default_factory=dict)


Action = Annotated[
    Click
    | DoubleClick
    | TripleClick
    | RightClick
    | MiddleClick
    | MouseMove
    | LongPress
    | Drag
    | Swipe
    | Scroll
    | TypeText
    | Key
    | SystemButton
    | OpenApp
    | Wait
    | Terminate
    | Answer
    | AskUser
    | ToolCall,
    Field(discriminator="type"),
]

ACTION_ADAPTER: TypeAdapter[Action] = TypeAdapter(Action)

ACTION_TYPES: dict[str, type[BaseModel]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        Click,
        DoubleClick,
        TripleClick,
        RightClick,
        MiddleClick,
        MouseMove,
        LongPress,
        Drag,
        Swipe,
        Scroll,
        TypeText,
        Key,
        SystemButton,
        OpenApp,
        Wait,
        Terminate,
        Answer,
        AskUser,
        ToolCall,
    )
}
"""Canonical ``type`` name → model class."""

EPISODE_ENDING = frozenset({"terminate", "answer"})
"""Action types after which an episode is over."""


def action_from_json(data: dict[str, Any] | str | bytes) -> Action:
    """Validate a canonical action from its JSON form (raises ``pydantic.ValidationError``)."""
    if isinstance(data, str | bytes):
        return ACTION_ADAPTER.validate_json(data)
    return ACTION_ADAPTER.validate_python(data)


def action_to_json(action: Action) -> dict[str, Any]:
    """The canonical JSON object: ``type`` plus exactly its fields, ``None`` for absent optionals."""
    return action.model_dump(mode="json")


def points_of(action: Action) -> list[tuple[float, float]]:
    """Every normalized point an action carries (for overlays and range checks)."""
    points: list[tuple[float, float]] = []
    for xk, yk in (("x", "y"), ("x2", "y2")):
        x, y = getattr(action, xk, None), getattr(action, yk, None)
        if x is not None and y is not None:
            points.append((x, y))
    return points
