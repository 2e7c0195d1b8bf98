"""Coordinate spaces: normalized [0, 1] ⇄ a model grid ⇄ resized-image pixels ⇄ device pixels.

Inside cua_native every point is normalized to the screenshot the model saw. A dialect converts
from its model's own space on parse and back on format; an environment converts to its pixels.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Grid:
    """An integer grid of relative coordinates: ``0..scale`` maps to ``[0, 1]``.

    MAI-UI and Qwen3-VL's mobile cookbook use 999, Qwen3-VL's computer-use cookbook 1000.
    """

    scale: int

    def to_unit(self, value: float) -> float:
        return value / self.scale

    def from_unit(self, value: float) -> int:
        return round(value * self.scale)

    @property
    def step(self) -> float:
        """One grid step in normalized units (round-trip tolerance)."""
        return 1.0 / self.scale


MAI_GRID = Grid(999)
QWEN_MOBILE_GRID = Grid(999)
QWEN_COMPUTER_GRID = Grid(1000)


@dataclass(frozen=True, slots=True)
class PixelSpace:
    """Pixels of an image of ``width`` × ``height`` (a resized model input or a device screen)."""

    width: int
    height: int

    def __post_init__(self) -> None:
        if self.width <= 0 or self.height <= 0:
            raise ValueError(f"image size must be positive, got {self.width}x{self.height}")

    def to_unit(self, x: float, y: float) -> tuple[float, float]:
        return x / self.width, y / self.height

    def from_unit(self, x: float, y: float) -> tuple[int, int]:
        """Pixel centre-preserving mapping, clamped to the last pixel."""
        px = min(self.width - 1, max(0, round(x * self.width)))
        py = min(self.height - 1, max(0, round(y * self.height)))
        return px, py


def clamp_unit(value: float) -> float:
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value
