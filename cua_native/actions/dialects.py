"""The ``Dialect`` protocol and the registry of model dialects by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from cua_native.actions.errors import ParsedOutput
from cua_native.actions.mai_ui import MaiUiDialect
from cua_native.actions.models import Action
from cua_native.actions.qwen3_vl import Qwen3VLDialect


@runtime_checkable
class Dialect(Protocol):
    """A model family's output format: pure, immutable, thread-safe.

    ``parse`` never raises on model text; ``format`` writes an action back in the model's own
    format (history, SFT data, fixtures) and raises ``ValueError`` for an action the model cannot
    express. ``parse(format(a)).action == a`` within ``coordinate_step()``.
    """

    @property
    def name(self) -> str: ...

    def parse(self, text: str, *, image_size: tuple[int, int] | None = None) -> ParsedOutput: ...

    def format(
        self,
        action: Action,
        *,
        thought: str | None = None,
        summary: str | None = None,
        image_size: tuple[int, int] | None = None,
    ) -> str: ...

    def coordinate_step(self, image_size: tuple[int, int] | None = None) -> float: ...


def _mai_ui(**options: Any) -> Dialect:
    return MaiUiDialect(**options)


def _mai_ui_grounding(**options: Any) -> Dialect:
    return MaiUiDialect(grounding=True, **options)


def _qwen3_vl(**options: Any) -> Dialect:
    return Qwen3VLDialect(**options)


def _qwen2_5_vl(**options: Any) -> Dialect:
    return Qwen3VLDialect(absolute_pixels=True, **options)


_FACTORIES: dict[str, Callable[..., Dialect]] = {
    "mai_ui": _mai_ui,
    "mai_ui_grounding": _mai_ui_grounding,
    "qwen3_vl": _qwen3_vl,
    "qwen2_5_vl": _qwen2_5_vl,
}
DIALECT_NAMES: tuple[str, ...] = tuple(_FACTORIES)
"""``qwen2_5_vl`` is ``qwen3_vl`` with ``absolute_pixels=True``."""


def get_dialect(name: str, **options: Any) -> Dialect:
    """The dialect called ``name`` with ``options`` (e.g. ``tool="computer_use"``, ``scale=1000``).

    Raises ``ValueError`` for an unknown name or option.
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown dialect {name!r}; valid names: {', '.join(DIALECT_NAMES)}")
    try:
        return factory(**options)
    except TypeError as error:
        raise ValueError(f"bad options for dialect {name!r}: {error}") from None
