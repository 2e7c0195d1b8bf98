"""Turn an AReaL ``ModelRequest`` into model inputs (CPU-bound: call it off the event loop).

Multimodal tensors come from ``req.metadata["multi_modal_input"]`` when the prompt builder
already ran the processor (no second run); otherwise ``req.image_data`` (base64 or data URIs)
is decoded and ``req.processor``'s image processor computes them. Either way the number of
image placeholder tokens in ``input_ids`` must match the image grids.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import torch
from areal.api.io_struct import ModelRequest
from PIL import Image

from cua_native.engine.vision_cache import image_keys

MM_TENSOR_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """What the model needs to place vision features: placeholder ids and the merge size."""

    image_token_id: int | None = None
    video_token_id: int | None = None
    spatial_merge_size: int = 2

    @classmethod
    def from_config(cls, config: Any) -> VisionSpec:
        vision = getattr(config, "vision_config", None)
        return cls(
            image_token_id=getattr(config, "image_token_id", None),
            video_token_id=getattr(config, "video_token_id", None),
            spatial_merge_size=int(getattr(vision, "spatial_merge_size", 2) or 2),
        )


@dataclass(slots=True)
class PreparedInput:
    """Prompt ids plus the multimodal tensors the model consumes with them."""

    input_ids: list[int]
    mm: dict[str, torch.Tensor] = field(default_factory=dict)
    """``pixel_values``/``image_grid_thw`` (and video equivalents) for the whole prompt."""
    image_keys: tuple[str, ...] = ()
    """One content key per image (``vision_cache.image_keys``), when asked for."""

    @property
    def has_vision(self) -> bool:
        return bool(self.mm)


def decode_image(data: str) -> Image.Image:
    """Decode one base64 string or ``data:image/...;base64,`` URI into an RGB image."""
    payload = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        raw = base64.b64decode(payload, validate=True)
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (binascii.Error, ValueError, OSError) as exc:
        raise ValueError(f"image_data entry is not a decodable base64 image: {exc}") from exc
    return image.convert("RGB")


def _mm_from_metadata(raw: Any) -> dict[str, torch.Tensor]:
    if isinstance(raw, list | tuple):
        if len(raw) != 1:
            raise ValueError(
                f"metadata['multi_modal_input'] as a list must hold exactly one dict, got {len(raw)}"
            )
        raw = raw[0]
    if not isinstance(raw, Mapping):
        raise ValueError("metadata['multi_modal_input'] must be a dict of tensors.")
    mm = {k: raw[k] for k in MM_TENSOR_KEYS if raw.get(k) is not None}
    for key, value in mm.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"multi_modal_input[{key!r}] must be a torch.Tensor, got {type(value)}"
            )
    return mm


def _mm_from_images(req: ModelRequest) -> dict[str, torch.Tensor]:
    if req.processor is None:
        raise ValueError(
            "request has image_data but no processor and no metadata['multi_modal_input']."
        )
    images = [decode_image(item) for item in req.image_data or []]
    image_processor = getattr(req.processor, "image_processor", req.processor)
    out = image_processor(images=images, return_tensors="pt")
    return {k: out[k] for k in ("pixel_values", "image_grid_thw") if k in out}


def _check_placeholders(
    ids: torch.Tensor, mm: dict[str, torch.Tensor], spec: VisionSpec, kind: str
) -> None:
    token_id = spec.image_token_id if kind == "image" else spec.video_token_id
    grid = mm.get(f"{kind}_grid_thw")
    pixels = mm.get("pixel_values" if kind == "image" else "pixel_values_videos")
    placeholders = int((ids == token_id).sum()) if token_id is not None else 0
    if grid is None:
        if pixels is not None:
            raise ValueError(f"{kind} pixel values given without {kind}_grid_thw.")
        if placeholders:
            raise ValueError(
                f"input_ids hold {placeholders} {kind} placeholder tokens but the request "
                f"carries no {kind} tensors (image_data or metadata['multi_modal_input'])."
            )
        return
    if pixels is None:
        raise ValueError(f"{kind}_grid_thw given without pixel values.")
    patches = int(grid.prod(dim=-1).sum())
    if pixels.shape[0] != patches:
        raise ValueError(f"{kind} pixel rows {pixels.shape[0]} != patches in grid {patches}.")
    expected = patches // (spec.spatial_merge_size**2)
    if placeholders != expected:
        raise ValueError(
            f"input_ids hold {placeholders} {kind} placeholder tokens but the {kind} grids need "
            f"{expected}: build input_ids with the same processor and images."
        )


def prepare_input(
    req: ModelRequest, spec: VisionSpec, keys: bool = False, executor: Executor | None = None
) -> PreparedInput:
    """Validate ``req`` and gather its model inputs. Raises ``ValueError`` on bad input.
    ``keys``: also key each image by content (for the engine's vision cache): the keys the
    prompt builder computed with the pixels (``PromptTensors.image_keys``), else a hash of
    the rows (on ``executor`` when given)."""
    ids = [int(t) for t in req.input_ids]
    if not ids:
        raise ValueError("input_ids is empty.")
    raw_mm = req.metadata.get("multi_modal_input") if req.metadata else None
    if raw_mm is not None:
        mm = _mm_from_metadata(raw_mm)
    elif req.image_data:
        mm = _mm_from_images(req)
    else:
        mm = {}
    mm = {k: v.detach().cpu() for k, v in mm.items()}
    ids_tensor = torch.tensor(ids, dtype=torch.long)
    _check_placeholders(ids_tensor, mm, spec, "image")
    _check_placeholders(ids_tensor, mm, spec, "video")
    found: tuple[str, ...] = ()
    if keys and "pixel_values" in mm and "image_grid_thw" in mm:
        given = getattr(raw_mm, "image_keys", None)  # the prompt builder's, computed once
        if isinstance(given, tuple) and len(given) == mm["image_grid_thw"].shape[0]:
            found = given
        else:
            found = image_keys(mm["pixel_values"], mm["image_grid_thw"], executor)
    return PreparedInput(input_ids=ids, mm=mm, image_keys=found)
