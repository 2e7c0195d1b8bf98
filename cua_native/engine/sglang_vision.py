"""The shape of a vision turn SGLang's own multimodal processor keeps exact.

What SGLang's tokenizer manager does with ``/generate`` ``input_ids`` + ``image_data``
(0.5.10.post1, the release ``areal[sglang]`` 1.0.4 pins, and 0.5.23 alike; the conformance
tests under ``tests/conformance`` run that code): the model's multimodal processor
(``QwenVLImageProcessor`` for Qwen2/2.5/3-VL and the MAI-UI checkpoints built on them) decodes
the ids back to text and hands that text and the images to the Hugging Face processor, which
expands every ``<|image_pad|>`` into ``grid_t·grid_h·grid_w / merge²`` pads. The ids the
scheduler runs are the processor's, not the ones sent. Two consequences:

* Ids whose pads are already expanded are expanded a second time: transformers' Qwen3-VL
  processor raises ``IndexError`` and the request fails. A vision turn therefore goes out with
  each image's run of pads **collapsed to one pad** (``collapse_image_pads``); the server's
  expansion gives back exactly the prompt builder's ids, because the builder renders the chat
  template with one pad per image and tokenizes that text (``cua_native.prompts.request``), so
  decoding and re-tokenizing it is the identity, and the server's image processor keeps the
  prepared image size (the pixel-budget check at load, ``training.cluster.checks.check_pixel_budget``).
* A continuation (prompt + the partial output of an aborted request, as AReaL resubmits it) is
  decoded and re-tokenized too: a sampled split that is not the tokenizer's own comes back as
  other ids. Such a turn is restarted instead (``engine.remote.CheckedSGLangBackend``).

Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMAGE_PAD = "<|image_pad|>"


def collapse_image_pads(ids: Sequence[int], pad_id: int) -> list[int]:
    """``ids`` with every run of consecutive ``pad_id`` reduced to one ``pad_id``."""
    out: list[int] = []
    for token in ids:
        if token == pad_id and out and out[-1] == pad_id:
            continue
        out.append(token)
    return out


def image_pad_id(request: Any) -> int:
    """The image pad id of an AReaL ``ModelRequest`` (from its processor or tokenizer).

    Raises ``ValueError`` when the request carries neither: without them the pads cannot be
    found, and sending the expanded ids would fail on the server."""
    processor = getattr(request, "processor", None)
    pad = getattr(processor, "image_token_id", None)
    if isinstance(pad, int):
        return pad
    tokenizer = getattr(request, "tokenizer", None) or getattr(processor, "tokenizer", None)
    if tokenizer is not None:
        pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if isinstance(pad, int) and pad != getattr(tokenizer, "unk_token_id", None):
            return pad
    raise ValueError(
        "a vision request for SGLang needs its processor or tokenizer (to find the image pads "
        "SGLang expands itself); the request carries neither"
    )


def sglang_vision_ids(request: Any) -> list[int]:
    """The ``input_ids`` to send SGLang for ``request``: its ids with one pad per image when it
    carries images, else its ids unchanged. Raises ``ValueError`` when the number of pad runs
    is not the number of images (the server would pair images and pads otherwise)."""
    ids = list(request.input_ids)
    images = request.image_data or []
    if not images:
        return ids
    pad = image_pad_id(request)
    collapsed = collapse_image_pads(ids, pad)
    runs = collapsed.count(pad)
    if runs != len(images):
        raise ValueError(
            f"the prompt has {runs} image pad runs for {len(images)} images in image_data"
        )
    return collapsed
