"""Training rows' screenshots as uint8 indices into a per-channel palette: an eighth of the bytes.

Each value of a Qwen-VL ``pixel_values`` row is an elementwise function of one uint8 channel
value of the image (rescale and normalise), so one channel of an image holds at most 256
distinct values; and a still image's row repeats its one frame over the temporal patch.
``compact`` keeps one frame as uint8 indices into a ``(channels, 256)`` palette of the values
that occur, in the rows' own dtype; ``expand`` rebuilds the rows bit for bit. Row layout: the
image processors' ``(channels, temporal_patch, patch, patch)`` flattened per patch row.

Contract: ``expand(compact(rows))`` equals ``rows`` in every bit (checked on the bits when
compacting); ``compact`` returns ``None`` — the rows then travel as they are — when a channel
holds more than 256 values or a row's frames differ. An entry that is not compact passes
``expand`` unchanged.

Why: AReaL's single-controller transport moves a training batch's tensors between processes
as base64 inside JSON, and fetches the batch again for each actor call; a 1088x2400
screenshot's float32 rows are 63 MB there, compact 7.8 MB (see
``bench/gpu/results/train-step-pack/README.md#the-rehearsals-whole-step-profiled``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

INDICES, PALETTE, FRAMES = "pixel_indices", "pixel_palette", "pixel_frames"
COMPACT_KEYS = (INDICES, PALETTE, FRAMES)
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def compact(
    values: torch.Tensor, channels: int = 3, frames: int = 2
) -> dict[str, torch.Tensor] | None:
    """``values`` (``[rows, channels * frames * patch²]``) as ``{pixel_indices: uint8 [rows,
    channels, patch²], pixel_palette: [channels, 256], pixel_frames: [] int}``, or ``None``."""
    bits = _BITS.get(values.dtype)
    width = channels * frames
    if bits is None or values.dim() != 2 or values.shape[1] % width or values.shape[0] == 0:
        return None
    rows = values.view(values.shape[0], channels, frames, -1)
    first = rows[:, :, 0]
    first_bits = first.view(bits)
    if any(not torch.equal(rows[:, :, t].view(bits), first_bits) for t in range(1, frames)):
        return None
    indices = torch.empty(first.shape, dtype=torch.uint8)
    palette = torch.zeros((channels, 256), dtype=values.dtype)
    for c in range(channels):
        plane = first[:, c].contiguous()
        found = torch.unique(plane)
        if found.numel() > 256:
            return None
        at = torch.searchsorted(found, plane)
        palette[c, : found.numel()] = found
        indices[:, c] = at.to(torch.uint8)
        if not torch.equal(found[at].view(bits), plane.view(bits)):  # e.g. -0.0 vs 0.0
            return None
    return {INDICES: indices, PALETTE: palette, FRAMES: torch.tensor(frames)}


def is_compact(entry: Mapping[str, Any]) -> bool:
    return INDICES in entry


def expand(entry: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` with ``pixel_values`` rebuilt from its compact keys (which it loses); an
    entry that is not compact, unchanged (a copy of the mapping)."""
    out = dict(entry)
    if not is_compact(entry):
        return out
    indices, palette = out.pop(INDICES), out.pop(PALETTE)
    frames = int(out.pop(FRAMES))
    rows, channels, area = indices.shape
    planes = torch.stack(
        [palette[c].index_select(0, indices[:, c].reshape(-1).long()) for c in range(channels)]
    ).view(channels, rows, area)
    out["pixel_values"] = (
        planes.permute(1, 0, 2)[:, :, None, :]
        .expand(rows, channels, frames, area)
        .reshape(rows, channels * frames * area)
    )
    return out
