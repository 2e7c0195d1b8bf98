"""Per-image pixel tensors, computed once per image with the processor's own image processor.

The Qwen2/2.5/3-VL image processors turn each image into its own rows of ``pixel_values`` and
its own ``image_grid_thw`` row, independently of the other images in the call (rescale and
normalise are elementwise, patches never cross images). So a prompt's tensors are exactly the
per-image tensors concatenated in prompt order, and an image that stays in the history window
for several turns is normalised once, not once per turn. ``tests/prompts`` proves the
equality against ``processor(text=..., images=...)``.

``patchify`` computes the same tensors several times faster for ``Qwen2VLImageProcessorFast``
(the image processor of Qwen2/2.5/3-VL and MAI-UI checkpoints): the image processor's
arithmetic redone in NumPy, and the patch layout as one copy with the temporal frame repeat
as a broadcast view instead of a concatenation.
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
    """``compute_features`` for a ``Qwen2VLImageProcessorFast`` (see the module docstring).

    Plain NumPy on purpose: it runs in worker threads next to the event loop, and torch's
    intra-op thread pool, entered from several threads at once, spends more time spinning than
    computing on images this small. Rescale + normalise is elementwise on uint8 input, so it is
    applied as a 256-entry table per channel, built with the image processor's arithmetic in its
    order and precision: bit-identical (``kernel_matches`` checks it) and twice as fast."""
    if image.mode != "RGB":
        raise ValueError(f"patchify expects an RGB image, got mode {image.mode}")
    ip = image_processor
    patch, merge, temporal = int(ip.patch_size), int(ip.merge_size), int(ip.temporal_patch_size)
    width, height = image.size
    if width % (patch * merge) or height % (patch * merge):
        raise ValueError(f"image size {width}x{height} is not a multiple of {patch * merge}")
    pixels = np.asarray(image, dtype=np.uint8)  # (H, W, C)
    channels = pixels.shape[2]
    grid_h, grid_w = height // patch, width // patch
    blocks = pixels.reshape(grid_h // merge, merge, patch, grid_w // merge, merge, patch, channels)
    # (bh, mh, ph, bw, mw, pw, C) -> (bh, bw, mh, mw, C, ph, pw): one row per patch
    ordered = np.ascontiguousarray(blocks.transpose(0, 3, 1, 4, 6, 2, 5))
    ordered = ordered.reshape(grid_h * grid_w, channels, patch * patch)
    table = normalization_table(ip, channels)
    rows = np.empty((grid_h * grid_w, channels, temporal, patch * patch), dtype=np.float32)
    for channel in range(channels):
        np.take(table[:, channel], ordered[:, channel], out=rows[:, channel, 0])
    rows[:, :, 1:] = rows[:, :, :1]  # the temporal repeat of a still image
    grid = torch.tensor([[1, grid_h, grid_w]], dtype=torch.long)
    return ImageFeatures(
        pixel_values=torch.from_numpy(rows.reshape(grid_h * grid_w, -1)), image_grid_thw=grid
    )


def normalization_table(ip: Any, channels: int) -> np.ndarray:
    """``(256, channels)`` float32: what the image processor's ``rescale_and_normalize`` maps
    each uint8 value of each channel to (mean/std fused with the rescale in float32, then
    subtract and divide, as ``BaseImageProcessorFast`` does)."""
    values = np.repeat(np.arange(256, dtype=np.float32)[:, None], channels, axis=1)
    if ip.do_normalize:
        mean = np.asarray(ip.image_mean, dtype=np.float32).reshape(-1)
        std = np.asarray(ip.image_std, dtype=np.float32).reshape(-1)
        if ip.do_rescale:
            scale = np.float32(1.0 / ip.rescale_factor)
            mean, std = mean * scale, std * scale
        return (values - mean) / std
    if ip.do_rescale:
        return values * np.float32(ip.rescale_factor)
    return values


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
    # NumPy for the copy: torch.cat of megabytes enters torch's intra-op pool, which spins
    # against the event loop and the other workers on a small machine (see ``patchify``).
    pixels = np.concatenate([f.pixel_values.numpy() for f in features])
    return {
        "pixel_values": torch.from_numpy(pixels),
        "image_grid_thw": torch.cat([f.image_grid_thw for f in features]),
    }


@dataclass(frozen=True, slots=True)
class PromptPixels:
    """A prompt's image tensors by reference: the per-image features, concatenated only when
    asked (``tensors()``). An episode keeps one per turn for its training rows; holding the
    images rather than each turn's concatenation keeps a 4-turn episode with a 3-image history
    at 4 images' worth of memory instead of 10."""

    features: tuple[ImageFeatures, ...] = ()
    given: dict[str, torch.Tensor] | None = None
    """Tensors computed as a whole (the processor path), returned as they are."""

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor]) -> PromptPixels:
        return cls(given=dict(tensors))

    def tensors(self) -> dict[str, torch.Tensor]:
        """``pixel_values`` and ``image_grid_thw`` of the prompt (a new concatenation)."""
        if self.given is not None:
            return dict(self.given)
        return concat_features(self.features)
