"""Past turns and the window of them a prompt shows.

A ``HistoryWindow`` says which past turns appear as text (from ``first_turn``) and which of
them also bring their screenshot (from ``first_image``). Budgeting only ever shrinks it: the
oldest screenshot goes first, then, when no past screenshot is left, the oldest text turn. The
system prompt, the task and the current screenshot are never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cua_native.actions.dialects import Dialect
from cua_native.actions.errors import ParsedOutput
from cua_native.prompts.images import PreparedImage


@dataclass
class HistoryStep:
    """One past turn."""

    screenshot: PreparedImage
    """The screenshot as the model saw it that turn."""
    parsed: ParsedOutput
    """What the dialect read from that turn's output (parse-error turns included)."""
    raw_text: str
    """The model's raw output."""
    feedback: str | None = None
    """An ask_user reply, an MCP tool result, or parse-error feedback for the model."""


@dataclass(frozen=True, slots=True)
class HistoryWindow:
    steps: int
    first_turn: int
    first_image: int

    @property
    def turns(self) -> range:
        return range(self.first_turn, self.steps)

    def has_image(self, index: int) -> bool:
        return index >= max(self.first_image, self.first_turn)

    @property
    def history_images(self) -> int:
        return self.steps - max(self.first_image, self.first_turn)


def initial_window(steps: int, history_images: int, max_images: int) -> HistoryWindow:
    """All turns as text; the last ``min(history_images, max_images) - 1`` with screenshots."""
    past_images = max(0, min(history_images, max_images) - 1)
    return HistoryWindow(steps=steps, first_turn=0, first_image=max(0, steps - past_images))


def shrink(window: HistoryWindow) -> HistoryWindow | None:
    """Drop one thing: the oldest past screenshot, else the oldest text turn; ``None`` if
    nothing droppable is left."""
    if window.history_images > 0:
        first = max(window.first_image, window.first_turn) + 1
        return HistoryWindow(window.steps, window.first_turn, first)
    if window.first_turn < window.steps:
        return HistoryWindow(window.steps, window.first_turn + 1, window.first_image)
    return None


def dropped(window: HistoryWindow, history_images: int) -> dict[str, int]:
    """What ``window`` left out compared with the family convention (``history_images``)."""
    wanted = min(max(0, history_images - 1), window.steps)
    return {"images": wanted - window.history_images, "turns": window.first_turn}


def check_history(history: Sequence[HistoryStep]) -> None:
    for index, step in enumerate(history):
        if not isinstance(step, HistoryStep):
            raise TypeError(f"history[{index}] is a {type(step).__name__}, not a HistoryStep")


def format_past_action(
    dialect: Dialect, step: HistoryStep, thought: str | None, summary: str | None = None
) -> str | None:
    """The past action in the model's own style, or ``None`` when the turn had no action or
    the dialect cannot express it (the caller then shows the raw text)."""
    action = step.parsed.action
    if action is None or step.parsed.error is not None:
        return None
    try:
        return dialect.format(
            action, thought=thought, summary=summary, image_size=step.screenshot.model_size
        )
    except ValueError:
        return None
