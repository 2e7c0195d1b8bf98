"""Messages + images → exact ids, tensors and an AReaL request.

Two paths give the same result (``tests/prompts`` proves it token for token and bit for bit):

* fast (``tokenize_prompt`` + ``expand_prompt``): render the chat template with one
  ``<|image_pad|>`` per image, tokenize that short text, expand each pad to
  ``grid_t·grid_h·grid_w / merge²`` ids, and concatenate the images' cached pixel tensors
  (``pixels.py``). This is what the Qwen2/2.5/3-VL processors do, minus re-normalising every
  history image and re-tokenizing thousands of pad strings each turn.
* reference (``run_processor``): the processor itself on the rendered text and the images.

Either way each pad is expanded exactly once; ids are never re-rendered or re-tokenized from an
expanded prompt. All functions are blocking; ``PromptBuilder`` runs them off the event loop.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from cua_native.prompts.images import PreparedImage
from cua_native.prompts.pixels import (
    PixelKernel,
    PromptPixels,
    PromptTensors,
    image_features,
)
from cua_native.prompts.token_types import mm_token_type_ids

VLLM_IMAGE_PLACEHOLDER = "placeholder"
"""AReaL's vLLM backend replaces every ``image_url`` with ``req.image_data`` in order."""

FAST_PATH_PROCESSORS = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor")
"""Processors whose ``__call__`` the fast path reproduces (same pad expansion and
``mm_token_type_ids``); any other processor goes through ``run_processor``."""


class PromptTokenMismatch(RuntimeError):
    """The ids disagree with the image grid (double expansion or a lost image)."""


@dataclass
class ProcessedPrompt:
    input_ids: list[int]
    multi_modal_input: Mapping[str, torch.Tensor]
    """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` (batch dim 1 for the
    ids). Read-only: tensors may be shared with the images' caches."""
    text: str
    """The rendered chat template (one pad per image), for logs and the monitor."""
    pixels: PromptPixels = field(default_factory=PromptPixels)
    """The images' tensors by reference (what an episode keeps for its training rows)."""


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """The rendered template and its ids with one pad id per image (not yet expanded)."""

    text: str
    ids: list[int]
    image_tokens: tuple[int, ...]
    """Tokens each image expands to, in prompt order."""

    @property
    def length(self) -> int:
        """The exact prompt length after expansion."""
        return len(self.ids) + sum(self.image_tokens) - len(self.image_tokens)


def supports_fast_path(processor: Any) -> bool:
    return type(processor).__name__ in FAST_PATH_PROCESSORS


def tokenizer_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with image parts as ``{"type": "image"}``: the template renders the same pad
    and nothing tries to load a URL."""
    out: list[dict[str, Any]] = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {"type": "image"} if part.get("type") == "image_url" else part for part in content
            ]
        out.append({**message, "content": content})
    return out


def vllm_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A private deep copy for AReaL's vLLM chat path (which rewrites image parts in place)."""
    out = copy.deepcopy(list(messages))
    for message in out:
        if isinstance(message["content"], list):
            for part in message["content"]:
                if part.get("type") == "image_url":
                    part["image_url"] = {"url": VLLM_IMAGE_PLACEHOLDER}
    return out


def render_text(processor: Any, messages: Sequence[dict[str, Any]]) -> str:
    text: str = processor.apply_chat_template(
        tokenizer_messages(messages), tokenize=False, add_generation_prompt=True
    )
    return text


def image_token_count(processor: Any, image: PreparedImage) -> int:
    """Tokens one image becomes: ``grid_h·grid_w / merge²`` (``grid_t`` is 1 for an image)."""
    image_processor = processor.image_processor
    patch, merge = int(image_processor.patch_size), int(image_processor.merge_size)
    width, height = image.model_size
    if width % (patch * merge) or height % (patch * merge):
        raise ValueError(
            f"image size {width}x{height} is not a multiple of {patch * merge}; "
            "prepare images with PromptBuilder.prepare_image"
        )
    return (height // patch) * (width // patch) // (merge * merge)


def _tokenizer(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)


def _image_token_id(processor: Any) -> int:
    token_id = getattr(processor, "image_token_id", None)
    if token_id is None:
        token_id = _tokenizer(processor).convert_tokens_to_ids(processor.image_token)
    return int(token_id)


def _check_pads(processor: Any, text: str, images: Sequence[PreparedImage]) -> None:
    pads = text.count(processor.image_token)
    if pads != len(images):
        raise PromptTokenMismatch(
            f"the template rendered {pads} image pads for {len(images)} images"
        )


def tokenize_prompt(
    processor: Any,
    messages: Sequence[dict[str, Any]],
    images: Sequence[PreparedImage],
    encode: Callable[[str], list[int]] | None = None,
) -> TokenizedPrompt:
    """Render and tokenize with one pad per image; no image processing. ``encode``: a tokenizer
    equivalent to the processor's (``segments.SegmentTokenizer.encode``)."""
    text = render_text(processor, messages)
    _check_pads(processor, text, images)
    ids: list[int] = encode(text) if encode else _tokenizer(processor)(text)["input_ids"]
    if ids.count(_image_token_id(processor)) != len(images):
        raise PromptTokenMismatch(
            f"the tokenizer did not make one {processor.image_token} id per image"
        )
    counts = tuple(image_token_count(processor, im) for im in images)
    return TokenizedPrompt(text=text, ids=ids, image_tokens=counts)


def count_tokens(
    processor: Any, messages: Sequence[dict[str, Any]], images: Sequence[PreparedImage]
) -> int:
    """The exact prompt length, without running the image processor."""
    return tokenize_prompt(processor, messages, images).length


def _token_types(processor: Any, input_ids: Sequence[int]) -> torch.Tensor:
    """The prompt's ``(1, L)`` ``mm_token_type_ids`` under the processor's pad ids."""
    video_id = getattr(processor, "video_token_id", None)
    return mm_token_type_ids(
        torch.tensor([list(input_ids)], dtype=torch.long),
        _image_token_id(processor),
        None if video_id is None else int(video_id),
    )


def expand_prompt(
    processor: Any,
    tokenized: TokenizedPrompt,
    images: Sequence[PreparedImage],
    *,
    kernel: PixelKernel | None = None,
) -> ProcessedPrompt:
    """The fast path's ids and tensors: pads expanded once, the images' cached pixels
    (images without cached pixels get them now; ``kernel``: see ``pixels.image_features``)
    concatenated when the tensors are first read (``pixels.PromptTensors``)."""
    if len(tokenized.image_tokens) != len(images):
        raise PromptTokenMismatch(
            f"the prompt was tokenized for {len(tokenized.image_tokens)} images, got {len(images)}"
        )
    image_processor = processor.image_processor
    features = [image_features(image_processor, im, kernel=kernel) for im in images]
    merge = merge_size(processor)
    pad_id = _image_token_id(processor)
    ids = tokenized.ids
    input_ids: list[int] = []
    start = 0
    for feature, expected in zip(features, tokenized.image_tokens, strict=True):
        tokens = feature.patches // (merge * merge)
        if tokens != expected:
            raise PromptTokenMismatch(
                f"image_grid_thw {feature.image_grid_thw.tolist()} gives {tokens} tokens, "
                f"the prepared image size {expected}"
            )
        try:
            position = ids.index(pad_id, start)
        except ValueError:
            raise PromptTokenMismatch("fewer image pads in the ids than images") from None
        input_ids += ids[start:position]
        input_ids += [pad_id] * tokens
        start = position + 1
    input_ids += ids[start:]
    pixels = PromptPixels(features=tuple(features))
    grid_tokens = sum(f.patches for f in features) // (merge * merge)
    _check_expansion(processor, input_ids, images, grid_tokens)
    mm = PromptTensors(pixels, {"mm_token_type_ids": partial(_token_types, processor, input_ids)})
    return ProcessedPrompt(
        input_ids=input_ids, multi_modal_input=mm, text=tokenized.text, pixels=pixels
    )


def run_processor(
    processor: Any, messages: Sequence[dict[str, Any]], images: Sequence[PreparedImage]
) -> ProcessedPrompt:
    """Render the template and run the processor on the prepared images (``do_resize=False``:
    they already have the size the model sees). The reference path."""
    text = render_text(processor, messages)
    _check_pads(processor, text, images)
    kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    if images:
        kwargs["images"] = [im.image for im in images]
        kwargs["do_resize"] = False
    out = processor(**kwargs)
    input_ids: list[int] = out["input_ids"][0].tolist()
    mm: dict[str, torch.Tensor] = {}
    for key in ("pixel_values", "image_grid_thw", "mm_token_type_ids"):
        if key in out:
            mm[key] = out[key]
    grid = mm.get("image_grid_thw")
    implied = 0 if grid is None else int(grid.prod(dim=-1).sum()) // merge_size(processor) ** 2
    _check_expansion(processor, input_ids, images, implied)
    pixels = PromptPixels.of({k: v for k, v in mm.items() if k != "mm_token_type_ids"})
    return ProcessedPrompt(input_ids=input_ids, multi_modal_input=mm, text=text, pixels=pixels)


def merge_size(processor: Any) -> int:
    return int(processor.image_processor.merge_size)


def _check_expansion(
    processor: Any,
    input_ids: list[int],
    images: Sequence[PreparedImage],
    implied: int,
) -> None:
    """``implied``: the image tokens the image grids imply."""
    found = input_ids.count(_image_token_id(processor))
    expected = sum(image_token_count(processor, im) for im in images)
    if not found == implied == expected:
        raise PromptTokenMismatch(
            f"{found} image tokens in input_ids, image_grid_thw implies {implied}, "
            f"the prepared image sizes {expected}"
        )


def model_request(
    processed: ProcessedPrompt,
    messages: Sequence[dict[str, Any]],
    images: Sequence[PreparedImage],
    processor: Any,
    gconfig: GenerationHyperparameters,
    metadata: dict[str, Any] | None = None,
    *,
    encode_images: bool = True,
) -> ModelRequest:
    """The AReaL request: ids for the token-in paths (SGLang, in-process), the processed
    tensors in ``metadata["multi_modal_input"]`` so an in-process engine need not run the
    processor, and with ``encode_images`` the base64 PNGs of the images as prepared
    (``image_data``) and the chat messages for vLLM. Without it both stay empty: only engines
    that read ``metadata["multi_modal_input"]`` can serve the request. Blocking when images
    still need encoding."""
    return ModelRequest(
        input_ids=list(processed.input_ids),
        gconfig=gconfig,
        tokenizer=_tokenizer(processor),
        processor=processor,
        image_data=[im.png_base64 for im in images] if encode_images else [],
        vision_msg_vllm=[vllm_messages(messages)] if images and encode_images else None,
        metadata={
            **(metadata or {}),
            "multi_modal_input": processed.multi_modal_input,
            "image_sizes": [im.model_size for im in images],
        },
    )
