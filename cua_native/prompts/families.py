"""The model families, in one place: each family's system prompt, its message renderer and the
dialect its history is written in. Code that differs by family looks the family up here instead
of branching on its name; a new family is one entry (plus its ``Family`` literal and
``VARIANTS`` in ``prompts.config``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from cua_native.actions.dialects import Dialect, get_dialect
from cua_native.gym.protocol import Task
from cua_native.prompts import mai_ui, qwen3_vl
from cua_native.prompts.config import Family, PromptConfig
from cua_native.prompts.history import HistoryStep, HistoryWindow
from cua_native.prompts.images import ImageUrl, PreparedImage


class RenderMessages(Protocol):
    def __call__(
        self,
        task: Task,
        history: Sequence[HistoryStep],
        current: PreparedImage,
        config: PromptConfig,
        dialect: Dialect,
        window: HistoryWindow,
        image_url: ImageUrl = ...,
    ) -> tuple[list[dict[str, Any]], list[PreparedImage]]: ...


@dataclass(frozen=True, slots=True)
class ModelFamily:
    name: Family
    system_prompt: Callable[[PromptConfig], str]
    """The system prompt of a config (for a variant that needs no screenshot to render it)."""
    render_messages: RenderMessages
    """Messages and images in prompt order (pure)."""
    dialect: Callable[[PromptConfig], Dialect]
    """The dialect that writes history in the style the config's prompt asks for."""


def _mai_ui_dialect(config: PromptConfig) -> Dialect:
    return get_dialect("mai_ui", scale=config.screen_grid)


def _qwen3_vl_dialect(config: PromptConfig) -> Dialect:
    tool = "computer_use" if config.variant == "computer_use" else "mobile_use"
    return get_dialect(
        "qwen3_vl", tool=tool, scale=config.screen_grid, absolute_pixels=config.absolute_pixels
    )


FAMILIES: Mapping[Family, ModelFamily] = MappingProxyType(
    {
        "mai_ui": ModelFamily(
            "mai_ui", mai_ui.system_prompt, mai_ui.render_messages, _mai_ui_dialect
        ),
        "qwen3_vl": ModelFamily(
            "qwen3_vl", qwen3_vl.system_prompt, qwen3_vl.render_messages, _qwen3_vl_dialect
        ),
    }
)


def family_of(config: PromptConfig) -> ModelFamily:
    """The family of a (validated) prompt config."""
    return FAMILIES[config.family]
