"""OpenAI chat messages → prompt ids and vision tensors, the way vLLM builds them for a
Hugging Face multimodal model: the model's chat template renders the messages (each
``image_url`` part becomes the template's image placeholder) and the model's processor expands
the placeholders and computes the pixels with its own resize rules. Images must be inline
(``data:`` URIs, as AReaL sends them); URLs are refused. Blocking: call off the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from cua_native.engine.inputs import MM_TENSOR_KEYS, decode_image
from cua_native.engine.serve.core import RequestError


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    input_ids: list[int]
    mm: dict[str, torch.Tensor]


def _image(part: Mapping[str, Any]) -> Image.Image:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, Mapping) else spec
    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url if not isinstance(url, str) else url[:60]
        raise RequestError(
            f"image_url {shown!r}: the stand-in server takes inline images only (data: URIs)"
        )
    try:
        return decode_image(url)
    except ValueError as exc:
        raise RequestError(str(exc)) from exc


def template_messages(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[Image.Image]]:
    """Messages with image parts as ``{"type": "image"}`` and the decoded images, in order."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    images: list[Image.Image] = []
    for message in messages:
        if not isinstance(message, Mapping) or "role" not in message:
            raise RequestError("each message must be an object with a role")
        content = message.get("content")
        if isinstance(content, list):
            parts: list[dict[str, Any]] = []
            for part in content:
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind == "image_url":
                    images.append(_image(part))
                    parts.append({"type": "image"})
                elif kind == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                else:
                    raise RequestError(f"message content part type {kind!r} is not supported")
            content = parts
        out.append({**message, "content": content})
    return out, images


def chat_prompt(
    processor: Any,
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """Render and process one chat request into prompt ids and vision tensors."""
    rendered, images = template_messages(messages)
    renderer = processor if processor is not None else tokenizer
    try:
        text = renderer.apply_chat_template(
            rendered,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **dict(chat_template_kwargs or {}),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise RequestError(f"the chat template cannot render these messages: {exc}") from exc
    if not images:
        return ChatPrompt(input_ids=list(tokenizer(text)["input_ids"]), mm={})
    if processor is None:
        raise RequestError("this model has no image processor: images cannot be served")
    out = processor(text=[text], images=images, return_tensors="pt")
    mm = {k: out[k] for k in MM_TENSOR_KEYS if k in out}
    return ChatPrompt(input_ids=out["input_ids"][0].tolist(), mm=mm)
