"""Per-image pixel tensors, computed once per image with the processor's own image processor.

The Qwen2/2.5/3-VL image processors turn each image into its own rows of ``pixel_values`` and
its own ``image_grid_thw`` row, independently of the other images in the call (rescale and
normalise are elementwise, patches never cross images). So a prompt's tensors are exactly the
per-image tensors concatenated in prompt order, and an image that stays in the history window
for several turns is normalised once, not once per turn. ``tests/prompts`` proves the
equality against ``processor(text=..., images=...)``.

``patchify`` computes the same tensors about 2-3x faster for ``Qwen2VLImageProcessorFast``
(the image processor of Qwen2/2.5/3-VL and MAI-UI checkpoints): the arithmetic is the image
processor's own ``rescale_and_normalize``; only the patch layout is done here, as one copy
with the temporal frame repeat as a broadcast view instead of a concatenation.
``kernel_matches`` checks it against the image processor on a synthetic image before use.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from cua_native.prompts.images import PreparedImage

_CONFIG_ATTRS = (
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "image_mean",
    "image_std",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "do_convert_rgb",
)
KERNEL_IMAGE_PROCESSORS = ("Qwen2VLImageProcessorFast",)


@dataclass(frozen=True, slots=True)
class ImageFeatures:
    """One image's share of the processor output."""

    pixel_values: torch.Tensor
    """``(grid_t·grid_h·grid_w, channels·temporal_patch·patch²)`` rows for this image."""
    image_grid_thw: torch.Tensor
    """``(1, 3)``: ``[grid_t, grid_h, grid_w]``."""

    @property
    def patches(self) -> int:
        return int(self.image_grid_thw.prod())


def image_processor_key(image_processor: Any) -> Hashable:
    """Everything the pixel tensors depend on: images prepared for one processor are reused by
    another only if it would compute the same tensors."""
    values = []
    for name in _CONFIG_ATTRS:
        value = getattr(image_processor, name, None)
        values.append(tuple(value) if isinstance(value, list | tuple) else value)
    return ("pixels", type(image_processor).__qualname__, *values)


def compute_features(image_processor: Any, image: PreparedImage) -> ImageFeatures:
    """Run the image processor on one prepared image (no resize: it has the model's size)."""
    out = image_processor(images=[image.image], do_resize=False, return_tensors="pt")
    grid = out["image_grid_thw"]
    if tuple(grid.shape) != (1, 3):
        raise ValueError(f"expected one image_grid_thw row, got shape {tuple(grid.shape)}")
    return ImageFeatures(pixel_values=out["pixel_values"], image_grid_thw=grid)


def patchify(image_processor: Any, image: Image.Image) -> ImageFeatures:
    """``compute_features`` for a ``Qwen2VLImageProcessorFast`` (see the module docstring)."""
    if image.mode != "RGB":
        raise ValueError(f"patchify expects an RGB image, got mode {image.mode}")
    ip = image_processor
    patch, merge, temporal = int(ip.patch_size), int(ip.merge_size), int(ip.temporal_patch_size)
    width, height = image.size
    if width % (patch * merge) or height % (patch * merge):
        raise ValueError(f"image size {width}x{height} is not a multiple of {patch * merge}")
    pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).unsqueeze(0)
    normalized = ip.rescale_and_normalize(
        pixels,
        ip.do_rescale,
        ip.rescale_factor,
        ip.do_normalize,
        _hashable(ip.image_mean),
        _hashable(ip.image_std),
    )
    channels = normalized.shape[1]
    grid_h, grid_w = height // patch, width // patch
    blocks = normalized.reshape(
        channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch
    )
    frames = blocks.unsqueeze(0).expand(temporal, *blocks.shape)
    # (temporal, C, bh, mh, ph, bw, mw, pw) -> (bh, bw, mh, mw, C, temporal, ph, pw)
    ordered = frames.permute(2, 5, 3, 6, 1, 0, 4, 7)
    rows = ordered.reshape(grid_h * grid_w, channels * temporal * patch * patch)
    grid = torch.tensor([[1, grid_h, grid_w]], dtype=torch.long)
    return ImageFeatures(pixel_values=rows, image_grid_thw=grid)


def _hashable(value: Any) -> Any:
    """Lists as tuples, as the image processor passes them (its mean/std fusion is cached)."""
    return tuple(value) if isinstance(value, list) else value


def kernel_matches(image_processor: Any) -> bool:
    """Whether ``patchify`` reproduces this image processor exactly (values, dtypes, layout),
    checked on a small synthetic image with a 3x2 grid of merge blocks."""
    if type(image_processor).__name__ not in KERNEL_IMAGE_PROCESSORS:
        return False
    factor = int(image_processor.patch_size) * int(image_processor.merge_size)
    rng = np.random.default_rng(0)
    probe = rng.integers(0, 256, (3 * factor, 2 * factor, 3), dtype=np.uint8)
    image = PreparedImage(
        image=Image.fromarray(probe, "RGB"),
        original_size=(2 * factor, 3 * factor),
        model_size=(2 * factor, 3 * factor),
    )
    try:
        mine = patchify(image_processor, image.image)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return False
    theirs = compute_features(image_processor, image)
    return all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        for a, b in (
            (mine.pixel_values, theirs.pixel_values),
            (mine.image_grid_thw, theirs.image_grid_thw),
        )
    )


def image_features(
    image_processor: Any, image: PreparedImage, *, kernel: bool = False
) -> ImageFeatures:
    """The image's tensors for this image processor, computed on first use. Blocking.

    ``kernel``: use ``patchify`` (only when ``kernel_matches(image_processor)``)."""
    key = image_processor_key(image_processor)
    if kernel:
        return image.cached(key, lambda: patchify(image_processor, image.image))
    return image.cached(key, lambda: compute_features(image_processor, image))


def concat_features(features: Sequence[ImageFeatures]) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of a prompt, images in prompt order."""
    if not features:
        return {}
    if len(features) == 1:
        only = features[0]
        return {"pixel_values": only.pixel_values, "image_grid_thw": only.image_grid_thw}
    return {
        "pixel_values": torch.cat([f.pixel_values for f in features]),
        "image_grid_thw": torch.cat([f.image_grid_thw for f in features]),
    }
