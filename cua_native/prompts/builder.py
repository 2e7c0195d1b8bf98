"""``PromptBuilder``: screenshots in, the exact request for ``engine.agenerate`` out.

Deterministic given (task, history, current image, config). Budgets: at most
``config.max_images`` images, at most ``config.max_context_tokens`` prompt tokens counted with
the processor's real tokenizer and image grids. Over budget, the oldest past screenshot goes
first, then the oldest text turn; the system prompt, the task and the current screenshot stay.

Per turn the heavy work is done once per screenshot: ``prepare_image`` resizes it, computes
its pixel tensors and (with ``encode_images``) its PNG; ``build`` only renders the template,
tokenizes the text, expands the pads and concatenates cached tensors (``request.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Any, TypeVar

import httpx
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from cua_native.actions.dialects import Dialect
from cua_native.gym.media import check_url_allowed, fetch_image_url
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import a11y
from cua_native.prompts.config import PromptConfig
from cua_native.prompts.families import family_of
from cua_native.prompts.history import (
    HistoryStep,
    HistoryWindow,
    check_history,
    dropped,
    initial_window,
    shrink,
)
from cua_native.prompts.images import (
    PreparedImage,
    message_url,
    prepare_image,
    sizing_from_processor,
    unencoded_url,
)
from cua_native.prompts.pixels import PixelKernel, PromptPixels, image_features
from cua_native.prompts.request import (
    ProcessedPrompt,
    TokenizedPrompt,
    expand_prompt,
    model_request,
    run_processor,
    supports_fast_path,
    tokenize_prompt,
)
from cua_native.prompts.segments import SegmentTokenizer

T = TypeVar("T")

DEFAULT_FETCH_TIMEOUT = 10.0


def default_image_threads() -> int:
    """A quarter of the CPUs this process may run on, 1 to 4: a turn's screenshot is one
    image, and the other cores serve the other episodes' turns and the engine."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus // 4))


class PromptTooLong(ValueError):
    """Even the minimum prompt (system, task, current screenshot) exceeds the context budget."""


@dataclass
class BuiltPrompt:
    messages: list[dict[str, Any]]
    """OpenAI-style messages; image parts are data URLs or the gym's URL (with
    ``encode_images=False``: the gym's URL or ``UNENCODED_IMAGE_URL``)."""
    input_ids: list[int]
    multi_modal_input: Mapping[str, torch.Tensor]
    """Read-only: tensors may be shared with the images' caches."""
    images: list[PreparedImage]
    request: ModelRequest
    dropped: dict[str, int] = field(default_factory=dict)
    text: str = ""
    """The rendered chat template (one pad per image)."""
    current: PreparedImage | None = None
    """This turn's screenshot as prepared (goes into the next turns' history)."""
    pixels: PromptPixels = field(default_factory=PromptPixels)
    """``multi_modal_input``'s image tensors by reference (keep this, not the tensors)."""


def dialect_for(config: PromptConfig) -> Dialect:
    """The dialect that writes history in the style this prompt asks the model for."""
    return family_of(config).dialect(config)


def render_messages(
    task: Task,
    history: Sequence[HistoryStep],
    current: PreparedImage,
    config: PromptConfig,
    dialect: Dialect | None = None,
    window: HistoryWindow | None = None,
    *,
    encode_images: bool = True,
) -> tuple[list[dict[str, Any]], list[PreparedImage]]:
    """The family's messages and images in prompt order; no processor, no budget beyond the
    image window (``history_images``, ``max_images``) unless ``window`` is given. With
    ``encode_images`` image parts are data URLs (PNG-encodes images not yet encoded)."""
    check_history(history)
    if window is None:
        window = initial_window(len(history), config.history_images or 1, config.max_images)
    messages, images = family_of(config).render_messages(
        task,
        history,
        current,
        config,
        dialect or dialect_for(config),
        window,
        message_url if encode_images else unencoded_url,
    )
    tree = a11y.prompt_part(current.accessibility_tree, config.accessibility_tree_chars)
    if tree is not None:  # after the current screenshot, in the last (user) message
        messages[-1] = {**messages[-1], "content": [*messages[-1]["content"], tree]}
    return messages, images


class PromptBuilder:
    """Builds one turn's prompt. Holds no per-episode state: safe to share across episodes.

    ``encode_images``: PNG/base64 each screenshot once for ``request.image_data`` and data URLs
    in ``messages`` (AReaL's remote SGLang/vLLM engines need them); an in-process engine that
    reads ``metadata["multi_modal_input"]`` can set it ``False`` and skip the encoding.
    ``use_processor``: run the processor on the whole prompt every turn (the reference path;
    taken anyway for processors the fast path does not cover). ``fast``, ``pixel_kernel`` (the
    NumPy ``PixelKernel``) and ``segments`` (the ``SegmentTokenizer``) say which path is taken;
    the last two are ``None`` unless checked exact against the processor at start.
    ``image_threads``: threads a new screenshot's resize and pixel rows are split over, in
    bands (the same bytes on any count; default ``default_image_threads()``).
    """

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
        encode_images: bool = True,
        use_processor: bool = False,
        image_threads: int | None = None,
    ) -> None:
        self.config = config
        self.processor = processor
        self.sizing = sizing_from_processor(processor, config.min_pixels, config.max_pixels)
        self.dialect = dialect or dialect_for(config)
        self.encode_images = encode_images
        self.image_threads = default_image_threads() if image_threads is None else image_threads
        if self.image_threads < 1:
            raise ValueError(f"image_threads must be >= 1, got {self.image_threads}")
        self.fast = not use_processor and supports_fast_path(processor)
        self.pixel_kernel = (
            PixelKernel.for_image_processor(processor.image_processor) if self.fast else None
        )
        self.segments = (
            SegmentTokenizer.for_tokenizer(getattr(processor, "tokenizer", processor))
            if self.fast
            else None
        )
        self._executor = executor
        self._http = http
        self._allowed = tuple(allowed_media_domains)
        self._fetch_timeout = fetch_timeout

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            return await asyncio.to_thread(fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args))

    async def prepare_image(
        self, screenshot: Screenshot, *, timings: dict[str, float] | None = None
    ) -> PreparedImage:
        """Decode (or fetch from an allow-listed URL), resize, and compute the pixel tensors
        (and PNG) once, off the event loop. ``timings`` gets seconds for ``decode``,
        ``resize``, ``pixels`` and (with ``encode_images``) ``encode``."""
        source = await self._source(screenshot)
        return await self._off_loop(
            self._prepare_blocking, source, screenshot.url, timings, screenshot.accessibility_tree
        )

    async def build_turn(
        self,
        task: Task,
        history: Sequence[HistoryStep],
        current: Screenshot | PreparedImage,
        gconfig: GenerationHyperparameters,
        *,
        timings: dict[str, float] | None = None,
    ) -> BuiltPrompt:
        """``prepare_image`` (unless ``current`` is already prepared) and ``build`` in one
        off-loop call: what an agent turn needs, with one thread hand-off instead of two
        (each costs a GIL round trip with the event loop). ``BuiltPrompt.current`` is the
        prepared screenshot."""
        check_history(history)
        history = list(history)
        if isinstance(current, PreparedImage):
            return await self._off_loop(
                self._build_blocking, task, history, current, gconfig, timings
            )
        source = await self._source(current)

        def prepare_and_build() -> BuiltPrompt:
            prepared = self._prepare_blocking(
                source, current.url, timings, current.accessibility_tree
            )
            return self._build_blocking(task, history, prepared, gconfig, timings)

        return await self._off_loop(prepare_and_build)

    async def _source(self, screenshot: Screenshot) -> bytes | Any:
        """The screenshot's bytes or image (fetched first when it is an allow-listed URL)."""
        if screenshot.url is not None:
            if self._http is None:
                check_url_allowed(screenshot.url, self._allowed)  # names the refused host first
                raise ValueError("a screenshot URL needs PromptBuilder(http=httpx.AsyncClient())")
            return await fetch_image_url(
                self._http, screenshot.url, self._allowed, self._fetch_timeout
            )
        source = screenshot.png if screenshot.png is not None else screenshot.image
        assert source is not None  # Screenshot guarantees exactly one
        return source

    def _prepare_blocking(
        self,
        source: Any,
        url: str | None,
        timings: dict[str, float] | None,
        accessibility_tree: str | None = None,
    ) -> PreparedImage:
        threads = self.image_threads
        image = prepare_image(
            source,
            self.sizing,
            url,
            timings,
            encode=self.encode_images,
            threads=threads,
            accessibility_tree=accessibility_tree,
        )
        if self.fast:
            start = perf_counter()
            image_features(
                self.processor.image_processor, image, kernel=self.pixel_kernel, threads=threads
            )
            if timings is not None:
                timings["pixels"] = perf_counter() - start
        return image

    async def build(
        self,
        task: Task,
        history: Sequence[HistoryStep],
        current: PreparedImage,
        gconfig: GenerationHyperparameters,
        *,
        timings: dict[str, float] | None = None,
    ) -> BuiltPrompt:
        """The prompt for this turn, within the image and token budgets (``PromptTooLong`` if
        the minimum does not fit). One off-loop call. ``timings`` gets seconds for
        ``template_tokenize`` (render + tokenize, budget retries included), ``assemble``
        (pad expansion and tensors; the processor run with ``use_processor``) and ``request``.

        History screenshots older than the image window can never return to a later prompt
        (the window only moves forward), so their cached tensors and PNG are released here.
        """
        check_history(history)
        history = list(history)
        return await self._off_loop(self._build_blocking, task, history, current, gconfig, timings)

    def _build_blocking(
        self,
        task: Task,
        history: list[HistoryStep],
        current: PreparedImage,
        gconfig: GenerationHyperparameters,
        timings: dict[str, float] | None,
    ) -> BuiltPrompt:
        config = self.config
        start = perf_counter()
        window = initial_window(len(history), config.history_images or 1, config.max_images)
        _release_outside(history, window, current)
        messages, images, tokenized, window = self._fit(task, history, current, window)
        tokenized_at = perf_counter()
        processed = self._process(tokenized, messages, images)
        assembled_at = perf_counter()
        lost = dropped(window, config.history_images or 1)
        request = model_request(
            processed,
            messages,
            images,
            self.processor,
            gconfig,
            {"dropped": lost},
            encode_images=self.encode_images,
        )
        if timings is not None:
            timings["template_tokenize"] = tokenized_at - start
            timings["assemble"] = assembled_at - tokenized_at
            timings["request"] = perf_counter() - assembled_at
        return BuiltPrompt(
            messages=messages,
            input_ids=processed.input_ids,
            multi_modal_input=processed.multi_modal_input,
            images=images,
            request=request,
            dropped=lost,
            text=processed.text,
            current=current,
            pixels=processed.pixels,
        )

    def _fit(
        self,
        task: Task,
        history: list[HistoryStep],
        current: PreparedImage,
        window: HistoryWindow,
    ) -> tuple[list[dict[str, Any]], list[PreparedImage], TokenizedPrompt, HistoryWindow]:
        """Shrink ``window`` until the prompt fits ``max_context_tokens``."""
        while True:
            messages, images = render_messages(
                task,
                history,
                current,
                self.config,
                self.dialect,
                window,
                encode_images=self.encode_images,
            )
            encode = self.segments.encode if self.segments is not None else None
            tokenized = tokenize_prompt(self.processor, messages, images, encode)
            if tokenized.length <= self.config.max_context_tokens:
                return messages, images, tokenized, window
            smaller = shrink(window)
            if smaller is None:
                raise PromptTooLong(
                    f"the minimum prompt (system, task, current screenshot) is "
                    f"{tokenized.length} tokens, over "
                    f"max_context_tokens={self.config.max_context_tokens}"
                )
            window = smaller

    def _process(
        self,
        tokenized: TokenizedPrompt,
        messages: list[dict[str, Any]],
        images: list[PreparedImage],
    ) -> ProcessedPrompt:
        if self.fast:
            processed = expand_prompt(self.processor, tokenized, images, kernel=self.pixel_kernel)
        else:
            processed = run_processor(self.processor, messages, images)
        if len(processed.input_ids) != tokenized.length:
            raise RuntimeError(
                f"prompt length {len(processed.input_ids)} differs from the counted "
                f"{tokenized.length}"
            )
        return processed


def _release_outside(
    history: Sequence[HistoryStep], window: HistoryWindow, current: PreparedImage
) -> None:
    """Release the caches of past screenshots before the image window (not shown again)."""
    kept = {id(current)}
    kept.update(id(history[i].screenshot) for i in window.turns if window.has_image(i))
    for step in history[: max(window.first_image, window.first_turn)]:
        if id(step.screenshot) not in kept:
            step.screenshot.release_cache()
