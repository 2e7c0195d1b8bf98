"""Messages + images → the model's own processor → exact ids, tensors and an AReaL request.

All functions here are blocking; ``PromptBuilder`` runs them off the event loop. The chat
template is rendered once with one ``<|image_pad|>`` per image and the processor expands each
pad to ``grid_t·grid_h·grid_w / merge²`` tokens exactly once; ids are never re-rendered or
re-tokenized from an expanded prompt.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from cua_native.prompts.images import PreparedImage

VLLM_IMAGE_PLACEHOLDER = "placeholder"
"""AReaL's vLLM backend replaces every ``image_url`` with ``req.image_data`` in order."""


class PromptTokenMismatch(RuntimeError):
    """The processor's ids disagree with the image grid (double expansion or a lost image)."""


@dataclass
class ProcessedPrompt:
    input_ids: list[int]
    multi_modal_input: dict[str, torch.Tensor]
    """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` (batch dim 1)."""
    text: str
    """The rendered chat template (one pad per image), for logs and the monitor."""


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
    return processor.apply_chat_template(
        tokenizer_messages(messages), tokenize=False, add_generation_prompt=True
    )


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


def count_tokens(
    processor: Any, messages: Sequence[dict[str, Any]], images: Sequence[PreparedImage]
) -> int:
    """The exact prompt length, without running the image processor."""
    text = render_text(processor, messages)
    tokenizer = _tokenizer(processor)
    pads = text.count(processor.image_token)
    if pads != len(images):
        raise PromptTokenMismatch(
            f"the template rendered {pads} image pads for {len(images)} images"
        )
    ids = tokenizer(text)["input_ids"]
    return len(ids) + sum(image_token_count(processor, im) - 1 for im in images)


def run_processor(
    processor: Any, messages: Sequence[dict[str, Any]], images: Sequence[PreparedImage]
) -> ProcessedPrompt:
    """Render the template and run the processor on the prepared images (``do_resize=False``:
    they already have the size the model sees)."""
    text = render_text(processor, messages)
    pads = text.count(processor.image_token)
    if pads != len(images):
        raise PromptTokenMismatch(
            f"the template rendered {pads} image pads for {len(images)} images"
        )
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
    _check_expansion(processor, input_ids, images, mm.get("image_grid_thw"))
    return ProcessedPrompt(input_ids=input_ids, multi_modal_input=mm, text=text)


def _check_expansion(
    processor: Any,
    input_ids: list[int],
    images: Sequence[PreparedImage],
    grid: torch.Tensor | None,
) -> None:
    pad_id = _tokenizer(processor).convert_tokens_to_ids(processor.image_token)
    found = sum(1 for token in input_ids if token == pad_id)
    merge = int(processor.image_processor.merge_size)
    implied = 0 if grid is None else int(grid.prod(dim=-1).sum()) // (merge * merge)
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
) -> ModelRequest:
    """The AReaL request: ids for the token-in paths (SGLang, in-process), base64 PNGs of the
    images as prepared, the chat messages for vLLM, and the processed tensors in
    ``metadata["multi_modal_input"]`` so an in-process engine need not run the processor."""
    return ModelRequest(
        input_ids=list(processed.input_ids),
        gconfig=gconfig,
        tokenizer=_tokenizer(processor),
        processor=processor,
        image_data=[im.png_base64 for im in images],
        vision_msg_vllm=[vllm_messages(messages)] if images else None,
        metadata={
            **(metadata or {}),
            "multi_modal_input": processed.multi_modal_input,
            "image_sizes": [im.model_size for im in images],
        },
    )
