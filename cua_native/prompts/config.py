"""Prompt configuration: which family, which published prompt variant, and the budgets.

Family defaults follow the published agents: MAI-UI keeps the last 3 screenshots (the current
one included), Qwen3-VL's cookbook only the current one; 64 images per prompt (vLLM's
``limit_mm_per_prompt``) and a 262144-token context.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

Family = Literal["mai_ui", "qwen3_vl"]

MAI_VARIANTS: tuple[str, ...] = ("default", "ask_user_mcp", "no_thinking", "grounding")
QWEN_VARIANTS: tuple[str, ...] = (
    "mobile_use_utils",
    "mobile_use_notebook",
    "mobile_use_mobileworld",
    "computer_use",
)
VARIANTS: dict[str, tuple[str, ...]] = {"mai_ui": MAI_VARIANTS, "qwen3_vl": QWEN_VARIANTS}
DEFAULT_VARIANT: dict[str, str] = {"mai_ui": "default", "qwen3_vl": "mobile_use_notebook"}
DEFAULT_HISTORY_IMAGES: dict[str, int] = {"mai_ui": 3, "qwen3_vl": 1}


class PromptConfigError(ValueError):
    """A prompt configuration is invalid; the message names the field and the allowed values."""


@dataclass(frozen=True)
class PromptConfig:
    """How prompts are built. ``None`` fields take the family/variant default on construction.

    ``response_format``: Qwen3-VL's "# Response format" section (Thought/Action lines); on by
    default for the notebook and MobileWorld variants, which publish it.
    ``system_preamble``: Qwen3-VL only, the system text before the ``# Tools`` block. ``""``
    reproduces the mobile notebook (the system text starts with ``"\\n\\n# Tools"``, i.e. the
    HF template with an empty system message); ``None`` writes no separator at all (MobileWorld's
    prompt starts with ``"# Tools"``); any other text is followed by ``"\\n\\n"`` as the HF
    template does (the computer-use notebook uses ``"You are a helpful assistant."``).
    ``screen_grid``: the relative grid written in Qwen's resolution line (999 mobile, 1000
    computer use); ignored with ``absolute_pixels`` (Qwen2.5-VL style: the resized image size).
    """

    family: Family
    variant: str | None = None
    history_images: int | None = None
    max_images: int = 64
    max_context_tokens: int = 262144
    response_format: bool | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    absolute_pixels: bool = False
    mcp_tools: tuple[dict[str, Any], ...] = ()
    available_apps: tuple[str, ...] | None = None
    screen_grid: int | None = None
    system_preamble: str | None = ""
    accessibility_tree_chars: int = 0
    """With a tree in the observation (a desktop gym's ``accessibility_tree`` option), the
    user message ends with it linearised, at most this many characters (``prompts.a11y``);
    0, the default: never (Qwen3-VL and MAI-UI are trained on screenshots alone)."""

    def __post_init__(self) -> None:
        if self.family not in VARIANTS:
            raise PromptConfigError(
                f"family must be one of {sorted(VARIANTS)}, got {self.family!r}"
            )
        variant = self.variant if self.variant is not None else DEFAULT_VARIANT[self.family]
        if variant not in VARIANTS[self.family]:
            raise PromptConfigError(
                f"variant {variant!r} is not a {self.family} variant; "
                f"choose one of {list(VARIANTS[self.family])}"
            )
        _set(self, "variant", variant)
        if self.history_images is None:
            _set(self, "history_images", DEFAULT_HISTORY_IMAGES[self.family])
        if self.response_format is None:
            default = variant in ("mobile_use_notebook", "mobile_use_mobileworld")
            _set(self, "response_format", default)
        if self.screen_grid is None:
            _set(self, "screen_grid", 1000 if variant == "computer_use" else 999)
        _set(self, "mcp_tools", tuple(self.mcp_tools))
        if self.available_apps is not None:
            _set(self, "available_apps", tuple(self.available_apps))
        self._validate()

    def _validate(self) -> None:
        _positive_int("history_images", self.history_images)
        _positive_int("max_images", self.max_images)
        _positive_int("max_context_tokens", self.max_context_tokens)
        _positive_int("screen_grid", self.screen_grid)
        for name in ("min_pixels", "max_pixels"):
            value = getattr(self, name)
            if value is not None:
                _positive_int(name, value)
        if (
            self.min_pixels is not None
            and self.max_pixels is not None
            and self.min_pixels > self.max_pixels
        ):
            raise PromptConfigError(
                f"min_pixels ({self.min_pixels}) must not exceed max_pixels ({self.max_pixels})"
            )
        for index, tool in enumerate(self.mcp_tools):
            if (
                not isinstance(tool, dict)
                or not isinstance(tool.get("name"), str)
                or not tool["name"]
            ):
                raise PromptConfigError(
                    f"mcp_tools[{index}] must be a dict with a non-empty 'name' "
                    f"(and 'description', 'parameters'), got {tool!r}"
                )
            if tool["name"] in ("mobile_use", "computer_use"):
                raise PromptConfigError(
                    f"mcp_tools[{index}] uses the reserved name {tool['name']!r}"
                )
        if self.family == "mai_ui":
            self._validate_mai()
        else:
            self._validate_qwen()

    def _validate_mai(self) -> None:
        if self.response_format:
            raise PromptConfigError("response_format is a Qwen3-VL option; MAI-UI has none")
        if self.absolute_pixels:
            raise PromptConfigError("absolute_pixels is a Qwen option; MAI-UI writes 0..999")
        if self.mcp_tools and self.variant != "ask_user_mcp":
            raise PromptConfigError(
                f"MCP tools need the MAI-UI variant 'ask_user_mcp', not {self.variant!r}"
            )
        if self.available_apps is not None:
            if not self.available_apps or not all(
                isinstance(app, str) and app for app in self.available_apps
            ):
                raise PromptConfigError("available_apps must be non-empty app names")
        if self.system_preamble not in ("", None):
            raise PromptConfigError("system_preamble is a Qwen3-VL option")

    def _validate_qwen(self) -> None:
        if self.available_apps is not None:
            raise PromptConfigError("available_apps is a MAI-UI option (its prompt's app list)")
        if self.absolute_pixels and self.variant == "computer_use":
            raise PromptConfigError("absolute_pixels applies to the mobile_use variants")


def _set(config: PromptConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PromptConfigError(f"{name} must be a positive integer, got {value!r}")


def default_prompt_config(family: str, **overrides: Any) -> PromptConfig:
    """The family's published defaults, with ``overrides`` applied (unknown keys refused).

    Qwen3-VL's MobileWorld variant gets ``system_preamble=None`` (its prompt starts at
    ``# Tools``) unless given.
    """
    known = {f.name for f in fields(PromptConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise PromptConfigError(f"unknown PromptConfig field(s) {unknown}; known: {sorted(known)}")
    if (
        family == "qwen3_vl"
        and overrides.get("variant") == "mobile_use_mobileworld"
        and "system_preamble" not in overrides
    ):
        overrides["system_preamble"] = None
    return PromptConfig(family=family, **overrides)  # type: ignore[arg-type]


def with_overrides(config: PromptConfig, **overrides: Any) -> PromptConfig:
    """A validated copy of ``config`` with ``overrides``."""
    return replace(config, **overrides)
