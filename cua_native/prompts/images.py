"""Screenshots → the exact image the model sees: decode, RGB, ``smart_resize``, PNG encode.

Everything here is synchronous CPU work; ``PromptBuilder`` runs it off the event loop. The
resized size is a multiple of the processor's ``patch_size · merge_size`` (32 for Qwen3-VL,
28 for Qwen2.5-VL) inside its pixel budget, so the processor (called with ``do_resize=False``)
sees exactly ``model_size`` and ``image_grid_thw`` is ``(1, h/patch, w/patch)``.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

from PIL import Image, UnidentifiedImageError
from qwen_vl_utils import smart_resize

PNG_COMPRESS_LEVEL = 1
"""Fast lossless encoding: the engine must get the same pixels, not the smallest file."""


class ImageDecodeError(ValueError):
    """Screenshot bytes are not a decodable image."""


@dataclass(frozen=True)
class PreparedImage:
    """A screenshot decoded and resized, as the model sees it.

    ``model_size`` is the size of ``image`` (the resized input); ``original_size`` the
    screenshot's. Normalized coordinates are relative to both, so they map back exactly.
    ``png_base64`` is ``image`` as PNG (what SGLang/vLLM receive); ``source_url`` the gym's URL
    when the screenshot came as one (shown in ``messages`` instead of a data URL).
    """

    image: Image.Image
    original_size: tuple[int, int]
    model_size: tuple[int, int]
    png_base64: str
    source_url: str | None = None

    @property
    def data_url(self) -> str:
        return f"data:image/png;base64,{self.png_base64}"

    @property
    def message_url(self) -> str:
        """The URL put in chat messages: the gym's URL if there was one, else a data URL."""
        return self.source_url or self.data_url


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


def resize_for_model(image: Image.Image, sizing: ImageSizing) -> Image.Image:
    """Bicubic resize to the ``smart_resize`` size (PIL's default filter in qwen-vl-utils)."""
    size = sizing.model_size(*image.size)
    if size == image.size:
        return image
    return image.resize(size, Image.Resampling.BICUBIC)


def encode_png_base64(image: Image.Image) -> str:
    with io.BytesIO() as buffer:
        image.save(buffer, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        return base64.b64encode(buffer.getvalue()).decode("ascii")


def prepare_image(
    source: bytes | Image.Image,
    sizing: ImageSizing,
    source_url: str | None = None,
    timings: dict[str, float] | None = None,
) -> PreparedImage:
    """Decode (bytes) or take (PIL) a screenshot and make the model's image. Blocking.

    ``timings``, when given, receives seconds per phase: ``decode``, ``resize``, ``encode``.
    """
    from time import perf_counter

    start = perf_counter()
    image = decode_image(source) if isinstance(source, bytes | bytearray) else source
    if not isinstance(image, Image.Image):
        raise ImageDecodeError(f"expected image bytes or a PIL image, got {type(source).__name__}")
    image = to_rgb(image)
    decoded = perf_counter()
    original = image.size
    resized = resize_for_model(image, sizing)
    if resized is image and image is source:
        resized = image.copy()
    resized_at = perf_counter()
    encoded = encode_png_base64(resized)
    done = perf_counter()
    if timings is not None:
        timings["decode"] = decoded - start
        timings["resize"] = resized_at - decoded
        timings["encode"] = done - resized_at
    return PreparedImage(
        image=resized,
        original_size=original,
        model_size=resized.size,
        png_base64=encoded,
        source_url=source_url,
    )
