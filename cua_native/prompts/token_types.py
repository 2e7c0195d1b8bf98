"""``mm_token_type_ids``: which prompt tokens are image or video placeholders, in the convention
of Qwen-VL's processors (0 text, 1 image pad, 2 video pad). The one computation of it: the
prompt builder's fast path, the engine's M-RoPE positions and the training rows (rollout turns
and demonstrations) all call ``mm_token_type_ids``."""

from __future__ import annotations

import torch


def mm_token_type_ids(
    ids: torch.Tensor, image_pad: int | None, video_pad: int | None = None
) -> torch.Tensor:
    """An int64 tensor shaped like ``ids``: 1 where ``ids`` is ``image_pad``, 2 where it is
    ``video_pad``, 0 elsewhere (a ``None`` pad marks nothing)."""
    types = torch.zeros_like(ids, dtype=torch.long)
    if image_pad is not None:
        types[ids == image_pad] = 1
    if video_pad is not None:
        types[ids == video_pad] = 2
    return types
