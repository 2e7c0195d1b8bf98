"""Shapes that draw a canonical action over its screenshot (an SVG overlay, no re-encoding).

Action coordinates are normalized to [0, 1]; shapes are in the screenshot's pixel viewBox.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POINT_ACTIONS = frozenset(
    {
        "click",
        "double_click",
        "triple_click",
        "right_click",
        "middle_click",
        "mouse_move",
        "long_press",
    }
)
SWIPE_LENGTH = 0.3
DIRECTIONS = {"up": (0.0, -1.0), "down": (0.0, 1.0), "left": (-1.0, 0.0), "right": (1.0, 0.0)}


@dataclass(frozen=True, slots=True)
class Shape:
    kind: str
    """``point``, ``arrow`` or ``caption``."""
    action_type: str
    x: float = 0.0
    y: float = 0.0
    x2: float = 0.0
    y2: float = 0.0
    text: str = ""


def _unit(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return min(1.0, max(0.0, float(value)))


def shapes_for(action_type: str | None, args: Any, width: int, height: int) -> list[Shape]:
    """The overlay of one action (empty when it has nothing to draw or malformed args)."""
    if not isinstance(args, dict):
        return []
    kind = action_type or str(args.get("type") or "")
    x, y = _unit(args.get("x")), _unit(args.get("y"))
    if kind in POINT_ACTIONS and x is not None and y is not None:
        return [Shape("point", kind, x * width, y * height)]
    if kind in ("swipe", "drag", "scroll"):
        x2, y2 = _unit(args.get("x2")), _unit(args.get("y2"))
        if kind == "scroll" and x2 is None:
            dx, dy = args.get("dx") or 0.0, args.get("dy") or 0.0
            if x is not None and y is not None and (dx or dy):
                norm = max(abs(dx), abs(dy))
                x2 = min(1.0, max(0.0, x + SWIPE_LENGTH * dx / norm))
                y2 = min(1.0, max(0.0, y - SWIPE_LENGTH * dy / norm))
        direction = DIRECTIONS.get(str(args.get("direction")))
        if x2 is None and direction is not None:
            x = 0.5 if x is None else x
            y = 0.5 if y is None else y
            x2 = min(1.0, max(0.0, x + SWIPE_LENGTH * direction[0]))
            y2 = min(1.0, max(0.0, y + SWIPE_LENGTH * direction[1]))
        if x is not None and y is not None and x2 is not None and y2 is not None:
            return [Shape("arrow", kind, x * width, y * height, x2 * width, y2 * height)]
        return []
    if kind in ("type", "answer", "ask_user") and isinstance(args.get("text"), str):
        return [Shape("caption", kind, width / 2, height * 0.92, text=args["text"])]
    return []
