"""KV-cached, left-padded batch decoding over a Hugging Face model (worker thread only).

Position ids are computed explicitly per row and passed to the model, so nothing depends on
state the model keeps between calls (Qwen3-VL caches ``rope_deltas`` on the module, which is
wrong as soon as two requests interleave). For Qwen-VL models with vision inputs the 3-D
M-RoPE positions come from the model's own ``get_rope_index`` on the unpadded row; text
rows use ``arange``. A decode step continues at ``max(position) + 1``, which is what the
model itself does (``cache_position + rope_deltas``). Tests check every logprob against one
plain forward pass of the model over prompt + output.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache, PreTrainedModel

from cua_native.engine.inputs import VisionSpec
from cua_native.engine.vision_cache import CachedVisionForward, ImageInput, VisionCache
from cua_native.prompts.token_types import mm_token_type_ids

_DECODE_SDPA_BACKENDS = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)


def sdpa_without_cudnn(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On CUDA, keep attention off cuDNN while decoding with a growing KV cache.

    cuDNN builds a new execution plan for every new key length, i.e. at every decode step:
    measured on an H200 in bf16, 40 ms instead of 16 ms per step (``bench/gpu/gpu_check.py``
    ``--no-cudnn-sdp``). Flash/efficient attention have no per-shape plans. CPU is unaffected.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(list(_DECODE_SDPA_BACKENDS))


@dataclass(slots=True)
class RowInput:
    """One sequence to (re)prefill: all its tokens so far and its vision tensors."""

    ids: list[int]
    mm: dict[str, torch.Tensor]
    image_keys: tuple[str, ...] = ()
    """One content key per image of ``mm`` (the vision cache's keys), or none."""


class BatchDecoder:
    """Holds the KV cache, attention mask and next positions of the rows being decoded."""

    def __init__(
        self,
        model: PreTrainedModel,
        device: torch.device,
        pad_id: int,
        vision_cache: VisionCache | None = None,
    ) -> None:
        self._model = model
        self._device = device
        self._pad_id = pad_id
        self._spec = VisionSpec.from_config(model.config)
        inner = getattr(model, "model", None)
        self._rope_index = getattr(inner, "get_rope_index", None)
        self._mrope = self._rope_index is not None
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None
        self._next_pos: torch.Tensor | None = None
        self._vision = (
            CachedVisionForward(model, vision_cache)
            if vision_cache is not None and CachedVisionForward.supports(model)
            else None
        )

    @property
    def size(self) -> int:
        return 0 if self._mask is None else int(self._mask.shape[0])

    @property
    def cache(self) -> DynamicCache:
        """The KV cache of the last ``prefill`` (rows left-padded to one width)."""
        if self._cache is None:
            raise ValueError("no rows prefilled")
        return self._cache

    @property
    def next_positions(self) -> list[int]:
        """Each row's rotary position for its next token."""
        return [] if self._next_pos is None else [int(p) for p in self._next_pos.tolist()]

    def _row_positions(self, row: RowInput) -> torch.Tensor:
        """Positions ``[3 or 1, L]`` of one unpadded row."""
        ids = torch.tensor(row.ids, dtype=torch.long)
        if self._rope_index is not None and row.mm:
            pos: torch.Tensor
            pos, _ = self._rope_index(
                ids[None],
                mm_token_type_ids=mm_token_type_ids(
                    ids[None], self._spec.image_token_id, self._spec.video_token_id
                ),
                image_grid_thw=row.mm.get("image_grid_thw"),
                video_grid_thw=row.mm.get("video_grid_thw"),
            )
            return pos[:, 0, :].cpu()
        planes = 3 if self._mrope else 1
        return torch.arange(len(row.ids)).expand(planes, -1)

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, **mm: torch.Tensor) -> torch.Tensor:
        assert self._cache is not None and self._mask is not None
        with sdpa_without_cudnn(ids.device):
            out = self._model(
                input_ids=ids,
                attention_mask=self._mask,
                position_ids=pos if self._mrope else pos[0],
                past_key_values=self._cache,
                use_cache=True,
                logits_to_keep=1,
                **mm,
            )
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def prefill(self, rows: list[RowInput]) -> torch.Tensor:
        """Start a fresh cache over ``rows`` (left-padded); return next-token logits ``[B, V]``."""
        if not rows:
            raise ValueError("prefill needs at least one row")
        width = max(len(r.ids) for r in rows)
        positions = [self._row_positions(r) for r in rows]
        planes = positions[0].shape[0]
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        pos = torch.zeros((planes, len(rows), width), dtype=torch.long)
        for i, (row, row_pos) in enumerate(zip(rows, positions, strict=True)):
            n = len(row.ids)
            ids[i, width - n :] = torch.tensor(row.ids, dtype=torch.long)
            mask[i, width - n :] = 1
            pos[:, i, width - n :] = row_pos
        self._cache = DynamicCache(config=self._model.config)
        self._mask = mask.to(self._device)
        self._next_pos = torch.stack([p.max() + 1 for p in positions]).to(self._device)
        if self._vision is not None and any(r.mm for r in rows) and all(map(_keyed, rows)):
            images = [image for r in rows if r.mm for image in _images_of(r)]
            with sdpa_without_cudnn(self._device):
                return self._vision(
                    ids.to(self._device), self._mask, pos.to(self._device), self._cache, images
                )
        mm: dict[str, torch.Tensor] = {}
        for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw"):
            parts = [r.mm[key] for r in rows if key in r.mm]
            if parts:
                tensor = torch.cat(parts, dim=0).to(self._device)
                if key.startswith("pixel_values"):
                    tensor = tensor.to(self._model.dtype)
                mm[key] = tensor
        return self._forward(ids.to(self._device), pos.to(self._device), **mm)

    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token per row; return next-token logits ``[B, V]``."""
        if self._mask is None or self._next_pos is None or len(tokens) != self.size:
            raise ValueError(f"step needs {self.size} tokens, got {len(tokens)}")
        ids = torch.tensor(tokens, dtype=torch.long, device=self._device)[:, None]
        ones = torch.ones((self.size, 1), dtype=self._mask.dtype, device=self._device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        planes = 3 if self._mrope else 1
        pos = self._next_pos.view(1, -1, 1).expand(planes, -1, 1)
        logits = self._forward(ids, pos)
        self._next_pos = self._next_pos + 1
        return logits

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at ``indices`` (in that order); an empty list resets."""
        if not indices:
            self.reset()
            return
        if indices == list(range(self.size)):
            return
        assert self._cache is not None and self._mask is not None and self._next_pos is not None
        index = torch.tensor(indices, dtype=torch.long, device=self._device)
        self._cache.batch_select_indices(index)
        self._mask = self._mask[index]
        self._next_pos = self._next_pos[index]

    def reset(self) -> None:
        self._cache = None
        self._mask = None
        self._next_pos = None


def _keyed(row: RowInput) -> bool:
    """Whether ``row``'s vision inputs can go through the cache: images only, each keyed."""
    if not row.mm:
        return True
    if set(row.mm) != {"pixel_values", "image_grid_thw"}:
        return False
    return len(row.image_keys) == row.mm["image_grid_thw"].shape[0]


def _images_of(row: RowInput) -> list[ImageInput]:
    """``row``'s images in prompt order: key, its ``pixel_values`` rows (a view), grid row."""
    grids = row.mm["image_grid_thw"]
    pixels = row.mm["pixel_values"]
    images: list[ImageInput] = []
    start = 0
    for key, grid in zip(row.image_keys, grids, strict=True):
        n = int(grid.prod())
        images.append(ImageInput(key, pixels[start : start + n], grid))
        start += n
    return images
