"""Screenshots as uint8 palette indices (``rollout/pixel_palette.py``): the image processor's
rows back bit for bit, an eighth of the bytes, and the rows kept as they are where that
cannot hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from cua_native.prompts.images import PreparedImage
from cua_native.prompts.pixels import ImageFeatures, PromptPixels, compute_features
from cua_native.rollout.pixel_palette import COMPACT_KEYS, compact, expand, is_compact
from cua_native.rollout.trajectory import episode_multi_modal_inputs


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.fixture(scope="module")
def processor_rows() -> torch.Tensor:
    """The tiny Qwen3-VL image processor's float32 rows of an image holding every uint8
    value in every channel."""
    from cua_native.models.tiny import build_processor, build_tokenizer

    image_processor = build_processor(build_tokenizer()).image_processor
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    pixels.reshape(-1, 3)[:256] = np.arange(256, dtype=np.uint8)[:, None]
    image = PreparedImage(
        image=Image.fromarray(pixels, "RGB"), original_size=(128, 96), model_size=(128, 96)
    )
    rows: torch.Tensor = compute_features(image_processor, image).pixel_values
    assert rows.dtype == torch.float32
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_processor_rows_come_back_bit_for_bit(
    processor_rows: torch.Tensor, dtype: torch.dtype
) -> None:
    rows = processor_rows.to(dtype)
    packed = compact(rows)
    assert packed is not None
    assert packed["pixel_indices"].dtype == torch.uint8
    assert packed["pixel_indices"].nbytes * (8 if dtype == torch.float32 else 4) == rows.nbytes
    back = expand({"image_grid_thw": torch.tensor([[1, 6, 8]]), **packed})
    assert set(back) == {"image_grid_thw", "pixel_values"}
    assert back["pixel_values"].dtype == dtype
    assert torch.equal(_bits(back["pixel_values"]), _bits(rows))


def test_rows_that_cannot_be_compacted_are_left_as_they_are(processor_rows: torch.Tensor) -> None:
    moving = processor_rows.clone().view(processor_rows.shape[0], 3, 2, -1)
    moving[0, 0, 1, 0] += 1.0  # the two frames differ: not one still image
    assert compact(moving.view(processor_rows.shape)) is None
    assert compact(torch.randn(8, 3 * 2 * 16)) is None  # > 256 values in a channel
    signed = torch.zeros(2, 3 * 2 * 4)
    signed[0] = -0.0  # equal to 0.0, other bits
    assert compact(signed) is None
    assert compact(processor_rows.to(torch.int64)) is None
    plain = {"pixel_values": processor_rows}
    assert not is_compact(plain) and expand(plain)["pixel_values"] is processor_rows


def test_an_episodes_turns_carry_compact_views_of_one_store(processor_rows: torch.Tensor) -> None:
    half = processor_rows.shape[0] // 2
    shots = [
        ImageFeatures(pixel_values=rows, image_grid_thw=torch.tensor([[1, 2, rows.shape[0] // 2]]))
        for rows in (processor_rows[:half], processor_rows[half:], processor_rows[:half].flip(0))
    ]
    pixels = [PromptPixels(features=tuple(shots[max(0, t - 1) : t + 1])) for t in range(3)]
    dense = episode_multi_modal_inputs(pixels, torch.bfloat16)
    packed = episode_multi_modal_inputs(pixels, torch.bfloat16, compact_pixels=True)
    bases = {id(e["pixel_indices"]._base) for e in packed}
    assert len(bases) == 1  # views of one compacted store
    for d, p in zip(dense, packed, strict=True):
        assert set(COMPACT_KEYS) <= set(p) and "pixel_values" not in p
        back = expand(p)
        assert torch.equal(_bits(back["pixel_values"]), _bits(d["pixel_values"]))
        assert torch.equal(back["image_grid_thw"], d["image_grid_thw"])
