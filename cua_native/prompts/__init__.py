"""Prompt builders for MAI-UI and Qwen3-VL: system prompts, history windows, image sizing, and
the exact-token ``ModelRequest`` for ``engine.agenerate``."""

from cua_native.prompts.builder import (
    BuiltPrompt,
    PromptBuilder,
    PromptTooLong,
    dialect_for,
    render_messages,
)
from cua_native.prompts.config import PromptConfig, PromptConfigError, default_prompt_config
from cua_native.prompts.history import HistoryStep
from cua_native.prompts.images import UNENCODED_IMAGE_URL, ImageDecodeError, PreparedImage
from cua_native.prompts.request import PromptTokenMismatch

__all__ = [
    "UNENCODED_IMAGE_URL",
    "BuiltPrompt",
    "HistoryStep",
    "ImageDecodeError",
    "PreparedImage",
    "PromptBuilder",
    "PromptConfig",
    "PromptConfigError",
    "PromptTokenMismatch",
    "PromptTooLong",
    "default_prompt_config",
    "dialect_for",
    "render_messages",
]
