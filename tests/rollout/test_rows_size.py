"""Training rows store each screenshot of an episode once, in the model's dtype
(docs/contracts.md#episode-screenshot-tensor); every turn's pixel_values equals the
concatenation of its prompt's images."""

from __future__ import annotations

import torch

from cua_native.prompts.pixels import ImageFeatures, PromptPixels, concat_features
from cua_native.rollout.trajectory import episode_multi_modal_inputs


def _shot(seed: int, rows: int = 6) -> ImageFeatures:
    g = torch.Generator().manual_seed(seed)
    return ImageFeatures(
        pixel_values=torch.randn((rows, 12), generator=g),
        image_grid_thw=torch.tensor([[1, 2, rows // 2]]),
    )


def test_sliding_window_rows_are_views_of_one_tensor() -> None:
    shots = [_shot(i, rows=4 + 2 * (i % 2)) for i in range(6)]
    pixels = [PromptPixels(features=tuple(shots[max(0, t - 2) : t + 1])) for t in range(6)]
    rows = episode_multi_modal_inputs(pixels, torch.bfloat16)
    bases = {id(r["pixel_values"]._base) for r in rows}
    assert len(bases) == 1 and None not in {r["pixel_values"]._base for r in rows}
    base = rows[0]["pixel_values"]._base
    assert base.dtype == torch.bfloat16
    assert base.shape[0] == sum(s.pixel_values.shape[0] for s in shots)  # each screenshot once
    for row, prompt in zip(rows, pixels, strict=True):
        expected = concat_features(prompt.features)
        assert torch.equal(row["pixel_values"], expected["pixel_values"].to(torch.bfloat16))
        assert torch.equal(row["image_grid_thw"], expected["image_grid_thw"])


def test_non_consecutive_images_get_their_own_copy() -> None:
    a, b, c = _shot(1), _shot(2), _shot(3)
    pixels = [PromptPixels(features=(a, b, c)), PromptPixels(features=(a, c))]
    rows = episode_multi_modal_inputs(pixels, None)
    assert torch.equal(rows[1]["pixel_values"], torch.cat([a.pixel_values, c.pixel_values]))
    assert rows[0]["pixel_values"].dtype == torch.float32


def test_processor_path_tensors_are_cast() -> None:
    given = {"pixel_values": torch.ones((4, 12)), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    (row,) = episode_multi_modal_inputs([PromptPixels.of(given)], torch.bfloat16)
    assert row["pixel_values"].dtype == torch.bfloat16
