"""The stand-in's reading of SGLang's multimodal processor: what becomes of ``input_ids`` that
arrive with ``image_data``.

SGLang (0.5.10.post1 to 0.5.23; ``tests/conformance`` runs their own ``TokenizerManager`` on
the same payloads) decodes the ids to text and runs the model's Hugging Face processor on that
text and the images; the processor's ids, pads expanded, are what the model runs. The stand-in
does the same with the model directory's processor, so a request that the real server would
expand twice fails here too (a 500, as SGLang's ``/generate`` handler lets anything but a
``ValueError`` through), and a re-tokenized continuation comes back as the processor's ids.

Where the stand-in still differs: when the number of image blocks in the decoded text is not
the number of images, SGLang falls back to its legacy loader (one pad per image, any spelling
of the block); the stand-in refuses such a request with a 400 instead.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from cua_native.engine.inputs import decode_image
from cua_native.engine.serve.core import RequestError

IMAGE_BLOCK = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>")
"""SGLang's ``QwenVLImageProcessor`` image-token regex (expanded or not)."""


def processed_by_the_server(
    processor: Any, input_ids: list[int], image_data: list[str]
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The ids and vision tensors SGLang builds from ``input_ids`` and ``image_data``.

    Raises ``RequestError`` (400) for undecodable images or a block/image count mismatch, and
    ``RuntimeError`` (500) where SGLang's processor fails with anything but a ``ValueError``."""
    tokenizer = getattr(processor, "tokenizer", processor)
    text = tokenizer.decode(input_ids)
    blocks = len(IMAGE_BLOCK.findall(text))
    if blocks != len(image_data):
        raise RequestError(
            f"the decoded prompt holds {blocks} image blocks for {len(image_data)} images "
            "(SGLang's legacy loader would pair them; the stand-in refuses)"
        )
    try:
        images = [decode_image(item) for item in image_data]
    except ValueError as exc:
        raise RequestError(str(exc)) from exc
    try:
        out = processor(text=[text], images=images, return_tensors="pt")
    except ValueError as exc:
        raise RequestError(f"the multimodal processor refused the request: {exc}") from exc
    except (IndexError, KeyError, TypeError) as exc:
        raise RuntimeError(
            f"the multimodal processor failed ({type(exc).__name__}: {exc}); input_ids whose "
            "image pads are already expanded are expanded again"
        ) from exc
    ids = [int(t) for t in out["input_ids"][0].tolist()]
    tensors = {k: out[k] for k in ("pixel_values", "image_grid_thw") if k in out}
    if "mm_token_type_ids" in out:
        tensors["mm_token_type_ids"] = out["mm_token_type_ids"]
    return ids, tensors
