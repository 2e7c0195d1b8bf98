"""Per-image pixel tensors, computed once per image with the processor's own image processor.

The Qwen2/2.5/3-VL image processors turn each image into its own rows of ``pixel_values`` and
its own ``image_grid_thw`` row, independently of the other images in the call (rescale and
normalise are elementwise, patches never cross images). So a prompt's tensors are exactly the
per-image tensors concatenated in prompt order, and an image that stays in the history window
for several turns is normalised once, not once per turn. ``tests/prompts`` proves the
equality against ``processor(text=..., images=...)``.

``PixelKernel`` computes the same tensors several times faster for
``Qwen2VLImageProcessorFast`` (the image processor of Qwen2/2.5/3-VL and MAI-UI checkpoints):
the image processor's arithmetic redone in NumPy, and the patch layout as one copy with the
temporal frame repeat as a broadcast view instead of a concatenation.
``PixelKernel.for_image_processor`` checks it against the image processor on a synthetic image
before use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import pairwise
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
KERNEL_IMAGE_PROCESSORS = ("Qwen2VLImageProcessorFast", "Qwen2VLImageProcessor")
"""Image processors the kernel may reproduce (the probe in ``for_image_processor`` decides):
transformers 5.3's ``Qwen2VLImageProcessorFast``; from transformers 5.17 the same processor is
``Qwen2VLImageProcessor`` (a torchvision backend) and the ``Fast`` name is a deprecated alias."""


@dataclass(frozen=True, slots=True)
class ImageFeatures:
    """One image's share of the processor output."""

    pixel_values: torch.Tensor
    """``(grid_t·grid_h·grid_w, channels·temporal_patch·patch²)`` rows for this image."""
    image_grid_thw: torch.Tensor
    """``(1, 3)``: ``[grid_t, grid_h, grid_w]``."""
    content_key: str | None = None
    """SHA-1 of everything the rows are a function of: the image processor's settings and
    the image's mode, size and pixel bytes (``image_features`` sets it). An engine's vision
    cache keys the image by it instead of hashing the rows (8x the bytes of the image)."""

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


ROWS_PER_CHUNK = 256
"""Patch rows ``PixelKernel`` aims to reorder and normalise per step (rounded to whole rows of
merge blocks, at least one): the step's uint8 and float32 scratch (~0.5 MB at patch 16) stays
in cache, so each output byte is written once, straight from it."""


@dataclass(frozen=True, slots=True)
class Normalization:
    """The image processor's ``rescale_and_normalize`` as per-channel float32 steps, in its
    order and precision (``BaseImageProcessorFast`` fuses the rescale into mean and std, then
    subtracts and divides; without ``do_normalize`` it multiplies by ``rescale_factor``)."""

    offset: np.ndarray | None
    """``(channels, 1)`` float32 subtracted first (``None``: no normalisation)."""
    divisor: np.ndarray | None
    """``(channels, 1)`` float32 divided by next."""
    factor: np.float32 | None
    """The rescale factor when there is no normalisation."""

    @classmethod
    def of(cls, ip: Any, channels: int) -> Normalization:
        if ip.do_normalize:
            mean = np.asarray(ip.image_mean, dtype=np.float32).reshape(-1)
            std = np.asarray(ip.image_std, dtype=np.float32).reshape(-1)
            if ip.do_rescale:
                scale = np.float32(1.0 / ip.rescale_factor)
                mean, std = mean * scale, std * scale
            offset = np.broadcast_to(mean, (channels,)).reshape(channels, 1).copy()
            divisor = np.broadcast_to(std, (channels,)).reshape(channels, 1).copy()
            return cls(offset=offset, divisor=divisor, factor=None)
        factor = np.float32(ip.rescale_factor) if ip.do_rescale else None
        return cls(offset=None, divisor=None, factor=factor)

    def apply(self, values: np.ndarray) -> None:
        """In place on float32 ``(..., channels, n)`` values."""
        if self.offset is not None and self.divisor is not None:
            np.subtract(values, self.offset, out=values)
            np.divide(values, self.divisor, out=values)
        elif self.factor is not None:
            np.multiply(values, self.factor, out=values)


@dataclass(frozen=True, slots=True)
class PixelKernel:
    """``compute_features`` for a ``Qwen2VLImageProcessorFast`` (see the module docstring),
    with the image processor's settings read once.

    Plain NumPy on purpose: it runs in worker threads next to the event loop, and torch's
    intra-op thread pool, entered from several threads at once, spends more time spinning than
    computing on images this small; it changes no thread setting. One step per row of merge
    blocks (or a few: ``ROWS_PER_CHUNK``): the step's uint8 patches are reordered into the
    processor's row order in a small scratch buffer, cast to float32, rescaled and normalised
    with the image processor's own float32 steps (``Normalization``: elementwise IEEE
    arithmetic, so bit-identical; ``for_image_processor`` checks it) in a second one, and
    written to the output once, both temporal slots in one sequential copy (a still image is
    its own temporal repeat). Only the output is large (the float32 rows are 8x the image's
    bytes); it comes from torch's allocator, not NumPy's (see ``rows``)."""

    patch: int
    merge: int
    temporal: int
    normalization: Normalization
    channels: int = 3

    @classmethod
    def build(cls, image_processor: Any, channels: int = 3) -> PixelKernel:
        """The kernel for these settings, unchecked (``for_image_processor`` checks)."""
        ip = image_processor
        return cls(
            patch=int(ip.patch_size),
            merge=int(ip.merge_size),
            temporal=int(ip.temporal_patch_size),
            normalization=Normalization.of(ip, channels),
            channels=channels,
        )

    @classmethod
    def for_image_processor(cls, image_processor: Any) -> PixelKernel | None:
        """The kernel if it reproduces this image processor exactly (values, dtypes, layout),
        checked on a small synthetic image with a 3x2 grid of merge blocks; else ``None``.
        Every uint8 value of every channel occurs in the probe, and the arithmetic is
        elementwise, so equality on the probe is equality on every image."""
        if type(image_processor).__name__ not in KERNEL_IMAGE_PROCESSORS:
            return None
        try:
            kernel = cls.build(image_processor)
            factor = kernel.patch * kernel.merge
            rng = np.random.default_rng(0)
            probe = rng.integers(0, 256, (3 * factor, 2 * factor, 3), dtype=np.uint8)
            probe.reshape(-1, 3)[:256] = np.arange(256, dtype=np.uint8)[:, None]
            image = PreparedImage(
                image=Image.fromarray(probe, "RGB"),
                original_size=(2 * factor, 3 * factor),
                model_size=(2 * factor, 3 * factor),
            )
            mine = kernel(image.image)
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return None
        theirs = compute_features(image_processor, image)
        same = all(
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
            for a, b in (
                (mine.pixel_values, theirs.pixel_values),
                (mine.image_grid_thw, theirs.image_grid_thw),
            )
        )
        return kernel if same else None

    def __call__(self, image: Image.Image, threads: int = 1) -> ImageFeatures:
        """The image's rows (RGB only); ``threads``: see ``rows``."""
        if image.mode != "RGB":
            raise ValueError(f"the pixel kernel expects an RGB image, got mode {image.mode}")
        return self.rows(np.asarray(image, dtype=np.uint8), threads)

    def rows(
        self, pixels: np.ndarray, threads: int = 1, out: torch.Tensor | None = None
    ) -> ImageFeatures:
        """The rows of an ``(H, W, C)`` uint8 image.

        ``threads`` > 1 splits the image into that many bands of whole rows of merge blocks
        (a band's rows are a contiguous run of the output) computed on threads of a pool made
        for the call; NumPy releases the GIL in its copies and arithmetic, and every value is
        the same whichever thread computes it. Each thread also takes the page faults of its
        share of a fresh output.

        ``out``: a contiguous float32 ``(patches, channels·temporal·patch²)`` tensor to write
        the rows into (returned as ``pixel_values``); by default a new one from
        ``torch.empty``. Not ``np.empty``: NumPy advises huge pages for arrays of 4 MiB and
        more, and where the kernel's huge-page defragmentation is ``madvise`` (a common
        default) each first touch of such a buffer may wait for the kernel to compact memory
        (``bench/perf/prompt_build.py`` measures both; the figures are in the prompt-build
        section of ``bench/gpu/results/engine-at-concurrency/README.md``)."""
        patch, merge, temporal = self.patch, self.merge, self.temporal
        height, width, channels = pixels.shape
        if width % (patch * merge) or height % (patch * merge):
            raise ValueError(f"image size {width}x{height} is not a multiple of {patch * merge}")
        if channels != self.channels:
            raise ValueError(f"the kernel is for {self.channels} channels, got {channels}")
        grid_h, grid_w = height // patch, width // patch
        count, area = grid_h * grid_w, patch * patch
        shape = (count, channels * temporal * area)
        if out is None:
            out = torch.empty(shape, dtype=torch.float32)
        elif out.shape != shape or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous float32 tensor of shape {shape}")
        rows = out.numpy().reshape(count, channels, temporal, area)
        per_band = grid_w * merge  # patch rows in one row of merge blocks
        step = max(1, ROWS_PER_CHUNK // per_band)  # rows of merge blocks per step
        blocks = pixels.reshape(
            grid_h // merge, merge, patch, grid_w // merge, merge, patch, channels
        )

        def fill(band: tuple[int, int]) -> None:
            lo, hi = band
            ordered = np.empty(
                (step, grid_w // merge, merge, merge, channels, patch, patch), np.uint8
            )
            values = np.empty((step * per_band, channels, area), np.float32)
            for first in range(lo, hi, step):
                last = min(first + step, hi)
                patches = ordered[: last - first]
                # (bh, mh, ph, bw, mw, pw, C) -> (bh, bw, mh, mw, C, ph, pw): one row per patch
                np.copyto(patches, blocks[first:last].transpose(0, 3, 1, 4, 6, 2, 5))
                chunk = values[: (last - first) * per_band]
                np.copyto(chunk, patches.reshape(chunk.shape))
                self.normalization.apply(chunk)
                # every temporal slot in one sequential write (a broadcast view, no copy)
                np.copyto(rows[first * per_band : last * per_band], chunk[:, :, None, :])

        bands = grid_h // merge
        split = max(1, min(threads, bands))
        ranges = list(pairwise(bands * i // split for i in range(split + 1)))
        if split == 1:
            fill(ranges[0])
        else:
            with ThreadPoolExecutor(split, thread_name_prefix="pixels") as pool:
                list(pool.map(fill, ranges))
        grid = torch.tensor([[1, grid_h, grid_w]], dtype=torch.long)
        return ImageFeatures(pixel_values=out, image_grid_thw=grid)


def patchify(image_processor: Any, image: Image.Image) -> ImageFeatures:
    """``PixelKernel`` for this image processor applied to one image (unchecked)."""
    return PixelKernel.build(image_processor)(image)


def kernel_matches(image_processor: Any) -> bool:
    """Whether ``PixelKernel`` reproduces this image processor exactly."""
    return PixelKernel.for_image_processor(image_processor) is not None


def image_features(
    image_processor: Any,
    image: PreparedImage,
    *,
    kernel: PixelKernel | None = None,
    threads: int = 1,
) -> ImageFeatures:
    """The image's tensors for this image processor, computed on first use. Blocking.

    ``kernel``: compute them with it (only one from ``PixelKernel.for_image_processor``), with
    ``threads`` (see ``PixelKernel.rows``; above 1 the content key is hashed on one more thread
    meanwhile)."""
    key = image_processor_key(image_processor)
    if kernel is not None:
        return image.cached(key, lambda: _kernel_features(kernel, key, image.image, threads))

    def reference() -> ImageFeatures:
        features = compute_features(image_processor, image)
        return replace(features, content_key=content_key(key, image.image, image.image.tobytes()))

    return image.cached(key, reference)


def _kernel_features(
    kernel: PixelKernel, key: Hashable, image: Image.Image, threads: int
) -> ImageFeatures:
    if image.mode != "RGB":
        raise ValueError(f"the pixel kernel expects an RGB image, got mode {image.mode}")
    pixels = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))  # = image.tobytes()
    if threads <= 1:
        return replace(kernel.rows(pixels), content_key=content_key(key, image, pixels.data))
    with ThreadPoolExecutor(1, thread_name_prefix="content-key") as pool:
        digest = pool.submit(content_key, key, image, pixels.data)
        features = kernel.rows(pixels, threads)
        return replace(features, content_key=digest.result())


def content_key(processor: Hashable, image: Image.Image, data: bytes | memoryview) -> str:
    """``ImageFeatures.content_key``: SHA-1 of the image processor's settings, the image's mode
    and size, and its pixel bytes ``data`` (``image.tobytes()`` or the same bytes as an array).
    """
    digest = hashlib.sha1(repr(processor).encode(), usedforsecurity=False)
    digest.update(f"{image.mode} {image.size}".encode())
    digest.update(data)
    return digest.hexdigest()


def concat_features(features: Sequence[ImageFeatures]) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of a prompt, images in prompt order."""
    if not features:
        return {}
    if len(features) == 1:
        only = features[0]
        return {"pixel_values": only.pixel_values, "image_grid_thw": only.image_grid_thw}
    # NumPy for the copy: torch.cat of megabytes enters torch's intra-op pool, which spins
    # against the event loop and the other workers on a small machine (see ``PixelKernel``);
    # into a buffer from torch's allocator, not NumPy's (huge-page advice: see ``rows``).
    arrays = [f.pixel_values.numpy() for f in features]
    dtype = features[0].pixel_values.dtype
    pixels = torch.empty((sum(len(a) for a in arrays), *arrays[0].shape[1:]), dtype=dtype)
    np.concatenate(arrays, out=pixels.numpy())
    return {
        "pixel_values": pixels,
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


class PromptTensors(Mapping[str, torch.Tensor]):
    """A prompt's ``multi_modal_input`` (``pixel_values``, ``image_grid_thw``, then the
    ``extra`` tensors), each computed on first access: the image tensors concatenated, the
    extra ones by their factories.

    What a request carries: an in-process engine reads it (in its own worker thread), while
    AReaL's remote engines take ``image_data`` and never touch it, so for them a turn no longer
    copies every history image into a new multi-megabyte tensor. Read-only; two threads reading
    at once may both compute a value, which is the same either way."""

    def __init__(
        self, pixels: PromptPixels, extra: Mapping[str, Callable[[], torch.Tensor]]
    ) -> None:
        self.pixels = pixels
        self._extra = dict(extra)
        if pixels.given is not None:
            self._image_keys: tuple[str, ...] = tuple(k for k in pixels.given if k not in extra)
        else:
            self._image_keys = ("pixel_values", "image_grid_thw") if pixels.features else ()
        self._values: dict[str, torch.Tensor] = {}

    @property
    def image_keys(self) -> tuple[str, ...] | None:
        """One content key per image (``ImageFeatures.content_key``), or ``None`` when the
        tensors were computed as a whole or an image has no key."""
        keys = tuple(f.content_key for f in self.pixels.features)
        if self.pixels.given is not None or not keys or None in keys:
            return None
        return tuple(k for k in keys if k is not None)

    def __getitem__(self, key: str) -> torch.Tensor:
        value = self._values.get(key)
        if value is not None:
            return value
        if key in self._extra:
            value = self._values[key] = self._extra[key]()
            return value
        if key not in self._image_keys:
            raise KeyError(key)
        images = self.pixels.tensors()
        self._values.update(images)
        return images[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._image_keys
        yield from self._extra

    def __len__(self) -> int:
        return len(self._image_keys) + len(self._extra)

    def __repr__(self) -> str:
        done = [key for key in self if key in self._values]
        return f"PromptTensors({list(self)}, computed: {done})"
