"""``PromptBuilder``: screenshots in, the exact request for ``engine.agenerate`` out.

Deterministic given (task, history, current image, config). Budgets: at most
``config.max_images`` images, at most ``config.max_context_tokens`` prompt tokens counted with
the processor's real tokenizer and image grids. Over budget, the oldest past screenshot goes
first, then the oldest text turn; the system prompt, the task and the current screenshot stay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import httpx
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from cua_native.actions.dialects import Dialect, get_dialect
from cua_native.gym.media import fetch_image_url
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import mai_ui, qwen3_vl
from cua_native.prompts.config import PromptConfig
from cua_native.prompts.history import (
    HistoryStep,
    HistoryWindow,
    check_history,
    dropped,
    initial_window,
    shrink,
)
from cua_native.prompts.images import PreparedImage, prepare_image, sizing_from_processor
from cua_native.prompts.request import count_tokens, model_request, run_processor

T = TypeVar("T")

DEFAULT_FETCH_TIMEOUT = 10.0


class PromptTooLong(ValueError):
    """Even the minimum prompt (system, task, current screenshot) exceeds the context budget."""


@dataclass
class BuiltPrompt:
    messages: list[dict[str, Any]]
    """OpenAI-style messages; image parts are data URLs or the gym's URL."""
    input_ids: list[int]
    multi_modal_input: dict[str, torch.Tensor]
    images: list[PreparedImage]
    request: ModelRequest
    dropped: dict[str, int] = field(default_factory=dict)
    text: str = ""
    """The rendered chat template (one pad per image)."""


def dialect_for(config: PromptConfig) -> Dialect:
    """The dialect that writes history in the style this prompt asks the model for."""
    if config.family == "mai_ui":
        return get_dialect("mai_ui", scale=config.screen_grid)
    tool = "computer_use" if config.variant == "computer_use" else "mobile_use"
    return get_dialect(
        "qwen3_vl", tool=tool, scale=config.screen_grid, absolute_pixels=config.absolute_pixels
    )


def render_messages(
    task: Task,
    history: Sequence[HistoryStep],
    current: PreparedImage,
    config: PromptConfig,
    dialect: Dialect | None = None,
    window: HistoryWindow | None = None,
) -> tuple[list[dict[str, Any]], list[PreparedImage]]:
    """The family's messages and images in prompt order; no processor, no budget beyond the
    image window (``history_images``, ``max_images``) unless ``window`` is given."""
    check_history(history)
    if window is None:
        window = initial_window(len(history), config.history_images or 1, config.max_images)
    family = mai_ui if config.family == "mai_ui" else qwen3_vl
    return family.render_messages(
        task, history, current, config, dialect or dialect_for(config), window
    )


class PromptBuilder:
    """Builds one turn's prompt. Holds no per-episode state: safe to share across episodes."""

    def __init__(
        self,
        config: PromptConfig,
        processor: Any,
        *,
        executor: Executor | None = None,
        http: httpx.AsyncClient | None = None,
        allowed_media_domains: Sequence[str] = (),
        fetch_timeout: float = DEFAULT_FETCH_TIMEOUT,
        dialect: Dialect | None = None,
    ) -> None:
        self.config = config
        self.processor = processor
        self.sizing = sizing_from_processor(processor, config.min_pixels, config.max_pixels)
        self.dialect = dialect or dialect_for(config)
        self._executor = executor
        self._http = http
        self._allowed = tuple(allowed_media_domains)
        self._fetch_timeout = fetch_timeout

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            return await asyncio.to_thread(fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def prepare_image(self, screenshot: Screenshot) -> PreparedImage:
        """Decode (or fetch from an allow-listed URL) and resize, off the event loop."""
        if screenshot.url is not None:
            if self._http is None:
                raise ValueError("a screenshot URL needs PromptBuilder(http=httpx.AsyncClient())")
            data = await fetch_image_url(
                self._http, screenshot.url, self._allowed, self._fetch_timeout
            )
            return await self._off_loop(prepare_image, data, self.sizing, screenshot.url)
        source = screenshot.png if screenshot.png is not None else screenshot.image
        assert source is not None  # Screenshot guarantees exactly one
        return await self._off_loop(prepare_image, source, self.sizing)

    async def build(
        self,
        task: Task,
        history: Sequence[HistoryStep],
        current: PreparedImage,
        gconfig: GenerationHyperparameters,
    ) -> BuiltPrompt:
        """The prompt for this turn, within the image and token budgets (``PromptTooLong`` if
        the minimum does not fit)."""
        check_history(history)
        config = self.config
        window: HistoryWindow | None = initial_window(
            len(history), config.history_images or 1, config.max_images
        )
        while True:
            assert window is not None
            messages, images = render_messages(task, history, current, config, self.dialect, window)
            tokens = await self._off_loop(count_tokens, self.processor, messages, images)
            if tokens <= config.max_context_tokens:
                break
            smaller = shrink(window)
            if smaller is None:
                raise PromptTooLong(
                    f"the minimum prompt (system, task, current screenshot) is {tokens} tokens, "
                    f"over max_context_tokens={config.max_context_tokens}"
                )
            window = smaller
        processed = await self._off_loop(run_processor, self.processor, messages, images)
        if len(processed.input_ids) != tokens:
            raise RuntimeError(
                f"prompt length {len(processed.input_ids)} differs from the counted {tokens}"
            )
        lost = dropped(window, config.history_images or 1)
        request = model_request(
            processed, messages, images, self.processor, gconfig, {"dropped": lost}
        )
        return BuiltPrompt(
            messages=messages,
            input_ids=processed.input_ids,
            multi_modal_input=processed.multi_modal_input,
            images=images,
            request=request,
            dropped=lost,
            text=processed.text,
        )
