"""Screenshots → the exact image the model sees: decode, RGB, ``smart_resize``; PNG on demand.

Everything here is synchronous CPU work; ``PromptBuilder`` runs it off the event loop. The
resized size is a multiple of the processor's ``patch_size · merge_size`` (32 for Qwen3-VL,
28 for Qwen2.5-VL) inside its pixel budget, so the processor (called with ``do_resize=False``)
sees exactly ``model_size`` and ``image_grid_thw`` is ``(1, h/patch, w/patch)``.

A ``PreparedImage`` carries a private cache: its PNG/base64 encoding (computed on first use of
``png_base64``) and its pixel tensors per image-processor configuration (``pixels.py``). Each
is computed at most once per image, whatever the number of turns it stays in the prompt.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from time import perf_counter
from typing import Any, TypeVar

from PIL import Image, UnidentifiedImageError
from qwen_vl_utils import smart_resize

T = TypeVar("T")

PNG_COMPRESS_LEVEL = 1
"""Fast lossless encoding: the engine must get the same pixels, not the smallest file."""

RESIZE_REDUCING_GAP = 2.0
"""PIL's two-step downscale (integer box reduce, then bicubic from at most 2× the target):
about twice as fast as a plain bicubic on a 5× phone-screenshot downscale, visually the same.
Exactness is unaffected: the same resized image goes to the processor and to the engine."""

_PNG_KEY = "png_base64"


UNENCODED_IMAGE_URL = "cua-native:unencoded-image"
"""The image URL in messages built without encoding (``PromptBuilder(encode_images=False)``):
the pixels travel as tensors; ``BuiltPrompt.images`` still holds the images."""


class ImageDecodeError(ValueError):
    """Screenshot bytes are not a decodable image."""


@dataclass(frozen=True)
class PreparedImage:
    """A screenshot decoded and resized, as the model sees it.

    ``model_size`` is the size of ``image`` (the resized input); ``original_size`` the
    screenshot's. Normalized coordinates are relative to both, so they map back exactly.
    ``source_url`` is the gym's URL when the screenshot came as one (shown in messages instead
    of a data URL). ``png_base64`` (what SGLang/vLLM receive) is encoded on first access;
    call it off the event loop, or let ``PromptBuilder(encode_images=True)`` do it.
    """

    image: Image.Image
    original_size: tuple[int, int]
    model_size: tuple[int, int]
    source_url: str | None = None
    accessibility_tree: str | None = None
    """The screen's accessibility tree when the observation carried one (``Screenshot``)."""
    _cache: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def png_base64(self) -> str:
        """``image`` as base64 PNG. Blocking on first access (then cached)."""
        return self.cached(_PNG_KEY, lambda: encode_png_base64(self.image))

    @property
    def is_encoded(self) -> bool:
        return _PNG_KEY in self._cache

    @property
    def data_url(self) -> str:
        return f"data:image/png;base64,{self.png_base64}"

    @property
    def message_url(self) -> str:
        """The URL put in chat messages: the gym's URL if there was one, else a data URL."""
        return self.source_url or self.data_url

    def cached(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()`` once per ``key`` for this image (races only compute twice)."""
        try:
            found: T = self._cache[key]
            return found
        except KeyError:
            value = compute()
            self._cache[key] = value
            return value

    def release_cache(self) -> None:
        """Forget the PNG and pixel tensors (recomputed if ever needed again)."""
        self._cache.clear()


ImageUrl = Callable[[PreparedImage], str]
"""What a message shows for an image (``message_url`` or ``unencoded_url``)."""


def message_url(image: PreparedImage) -> str:
    """The gym's URL, else a data URL (encodes the PNG if not yet done: blocking)."""
    return image.message_url


def unencoded_url(image: PreparedImage) -> str:
    """The gym's URL, else ``UNENCODED_IMAGE_URL``: never encodes."""
    return image.source_url or UNENCODED_IMAGE_URL


@dataclass(frozen=True, slots=True)
class ImageSizing:
    """``smart_resize`` parameters: ``factor`` = patch · merge, pixel bounds of the processor."""

    factor: int
    min_pixels: int
    max_pixels: int

    def model_size(self, width: int, height: int) -> tuple[int, int]:
        """(w, h) the model sees for a ``width`` × ``height`` screenshot."""
        try:
            h, w = smart_resize(
                height,
                width,
                factor=self.factor,
                min_pixels=self.min_pixels,
                max_pixels=self.max_pixels,
            )
        except (ValueError, AssertionError) as exc:
            raise ImageDecodeError(f"cannot size a {width}x{height} image: {exc}") from exc
        return w, h


def sizing_from_processor(
    processor: Any, min_pixels: int | None = None, max_pixels: int | None = None
) -> ImageSizing:
    """The processor's resize rule; ``min_pixels``/``max_pixels`` override its ``size``."""
    image_processor = getattr(processor, "image_processor", processor)
    patch = int(image_processor.patch_size)
    merge = int(getattr(image_processor, "merge_size", 2))
    size = getattr(image_processor, "size", None) or {}
    proc_min = size.get("shortest_edge", getattr(image_processor, "min_pixels", None))
    proc_max = size.get("longest_edge", getattr(image_processor, "max_pixels", None))
    lo = min_pixels if min_pixels is not None else proc_min
    hi = max_pixels if max_pixels is not None else proc_max
    if lo is None or hi is None:
        raise ValueError("the processor has no pixel bounds; set min_pixels/max_pixels")
    if lo > hi:
        raise ValueError(f"min_pixels ({lo}) exceeds max_pixels ({hi})")
    return ImageSizing(factor=patch * merge, min_pixels=int(lo), max_pixels=int(hi))


def decode_image(data: bytes) -> Image.Image:
    """Decode PNG/JPEG/... bytes fully (raises ``ImageDecodeError``)."""
    if not data:
        raise ImageDecodeError("screenshot bytes are empty")
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(f"screenshot bytes are not a decodable image: {exc}") from exc
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB as qwen-vl-utils does it: transparency composited on white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.split()[3])
        return background
    return image.convert("RGB")


def resize_for_model(
    image: Image.Image,
    sizing: ImageSizing,
    reducing_gap: float | None = RESIZE_REDUCING_GAP,
    threads: int = 1,
) -> Image.Image:
    """Bicubic resize to the ``smart_resize`` size (``reducing_gap``: see
    ``RESIZE_REDUCING_GAP``; ``None`` is a plain bicubic like qwen-vl-utils). ``threads`` > 1
    resizes in bands on that many threads where that is exact (``banded_resize``)."""
    size = sizing.model_size(*image.size)
    if size == image.size:
        return image
    if threads > 1:
        banded = banded_resize(image, size, reducing_gap, threads)
        if banded is not None:
            return banded
    return image.resize(size, Image.Resampling.BICUBIC, reducing_gap=reducing_gap)


def banded_resize(
    image: Image.Image, size: tuple[int, int], reducing_gap: float | None, threads: int
) -> Image.Image | None:
    """``image.resize(size, BICUBIC, reducing_gap=...)`` in ``threads`` bands, or ``None``
    where a band would not be exact.

    Pillow resamples in separable passes, each a function of one row (horizontal pass) or one
    column (vertical pass) and of the two lengths along it; a pass whose length does not change
    is skipped. So when only the width changes (a 1080x2400 phone screenshot becoming
    1088x2400), bands of whole rows resized on their own are the rows of the whole resize, and
    when only the height changes (1920x1080 -> 1920x1088), bands of whole columns; Pillow
    releases the GIL while it resamples. Taken only when the changed side shrinks by less than
    ``reducing_gap`` (no ``reduce`` step in front); else ``None``."""
    width, height = image.size
    new_width, new_height = size
    if (new_width == width) == (new_height == height):
        return None  # both sides change (or neither): one pass depends on the other's rows
    along, new_along, across = (
        (width, new_width, height) if new_height == height else (height, new_height, width)
    )
    if reducing_gap is not None and int(along / new_along / reducing_gap) > 1:
        return None
    bands = max(1, min(threads, across // 64))
    if bands == 1:
        return None
    cuts = list(pairwise(across * i // bands for i in range(bands + 1)))
    rows = new_height == height

    def one(band: tuple[int, int]) -> Image.Image:
        lo, hi = band
        box = (0, lo, width, hi) if rows else (lo, 0, hi, height)
        part_size = (new_width, hi - lo) if rows else (hi - lo, new_height)
        return image.crop(box).resize(
            part_size, Image.Resampling.BICUBIC, reducing_gap=reducing_gap
        )

    out = Image.new(image.mode, size)
    with ThreadPoolExecutor(bands, thread_name_prefix="resize") as pool:
        for (lo, _), part in zip(cuts, pool.map(one, cuts), strict=True):
            out.paste(part, (0, lo) if rows else (lo, 0))
    return out


def encode_png_base64(image: Image.Image) -> str:
    with io.BytesIO() as buffer:
        image.save(buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        return base64.b64encode(buffer.getvalue()).decode("ascii")


def prepare_image(
    source: bytes | Image.Image,
    sizing: ImageSizing,
    source_url: str | None = None,
    timings: dict[str, float] | None = None,
    *,
    encode: bool = False,
    threads: int = 1,
    accessibility_tree: str | None = None,
) -> PreparedImage:
    """Decode (bytes) or take (PIL) a screenshot and make the model's image. Blocking.

    ``encode`` fills the PNG cache now (else on first ``png_base64``). ``timings``, when given,
    receives seconds per phase: ``decode``, ``resize`` (and ``encode`` with ``encode``).
    ``threads``: see ``resize_for_model`` (the image is the same either way).
    """
    start = perf_counter()
    image = decode_image(source) if isinstance(source, bytes | bytearray) else source
    if not isinstance(image, Image.Image):
        raise ImageDecodeError(f"expected image bytes or a PIL image, got {type(source).__name__}")
    image = to_rgb(image)
    decoded = perf_counter()
    original = image.size
    resized = resize_for_model(image, sizing, threads=threads)
    if resized is image and image is source:
        resized = image.copy()
    resized_at = perf_counter()
    prepared = PreparedImage(
        image=resized,
        original_size=original,
        model_size=resized.size,
        source_url=source_url,
        accessibility_tree=accessibility_tree,
    )
    if encode:
        prepared.png_base64  # noqa: B018 (fills the cache)
    if timings is not None:
        timings["decode"] = decoded - start
        timings["resize"] = resized_at - decoded
        if encode:
            timings["encode"] = perf_counter() - resized_at
    return prepared
