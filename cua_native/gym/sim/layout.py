"""Per-screen layout: the elements on screen, their boxes, and what a touch on them does.

Boxes are in design pixels of a 1080 × 2400 phone; a screen of another size scales them, so a
layout is the same in normalized coordinates at every resolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DESIGN_W = 1080
DESIGN_H = 2400
STATUS_H = 90
APPBAR_BOTTOM = 250
NAV_TOP = 2250

Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class Element:
    """Something drawn on screen. ``tap``/``long`` are commands run by ``execute``."""

    id: str
    kind: str
    box: Box
    label: str = ""
    detail: str = ""
    value: Any = None
    tap: str | None = None
    long: str | None = None
    visible: Box | None = None
    """The part inside the scroll viewport (``None``: not clipped)."""

    @property
    def hit_box(self) -> Box:
        return self.visible if self.visible is not None else self.box

    @property
    def fully_visible(self) -> bool:
        return self.visible is None or self.visible == self.box

    def contains(self, x: float, y: float) -> bool:
        x0, y0, x1, y1 = self.hit_box
        return x0 <= x < x1 and y0 <= y < y1


@dataclass(frozen=True, slots=True)
class Layout:
    elements: tuple[Element, ...]
    viewport: Box | None = None
    """The scrollable region of the screen, if any."""
    content_height: float = 0.0
    modal: bool = False
    """A menu is open: only its elements take touches; a touch elsewhere closes it."""

    @property
    def max_scroll(self) -> float:
        if self.viewport is None:
            return 0.0
        return max(0.0, self.content_height - (self.viewport[3] - self.viewport[1]))

    def find(self, label: str, *, fully_visible: bool = True) -> Element | None:
        """The interactive element with this label (case-insensitive), if it is on screen."""
        wanted = label.casefold()
        for element in self.elements:
            if element.label.casefold() != wanted or (element.tap or element.long) is None:
                continue
            if fully_visible and not element.fully_visible:
                continue
            return element
        return None

    def by_id(self, element_id: str) -> Element | None:
        return next((e for e in self.elements if e.id == element_id), None)

    def hit(self, x: float, y: float, *, long: bool = False) -> Element | None:
        """The top-most element at a design point that reacts to a tap (or a long press)."""
        for element in reversed(self.elements):
            command = element.long if long else element.tap
            if command is not None and element.contains(x, y):
                return element
        return None

    def in_viewport(self, x: float, y: float) -> bool:
        if self.viewport is None:
            return False
        x0, y0, x1, y1 = self.viewport
        return x0 <= x < x1 and y0 <= y < y1


def centre_unit(element: Element) -> tuple[float, float]:
    """The normalized centre of an element's visible part (where a solution clicks)."""
    x0, y0, x1, y1 = element.hit_box
    return (x0 + x1) / 2 / DESIGN_W, (y0 + y1) / 2 / DESIGN_H
