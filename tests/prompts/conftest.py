"""Shared fixtures: tiny local Qwen3-VL and Qwen2.5-VL processors (real templates, real
processor classes, tokenizer saved and loaded back like a checkpoint's) and screenshots."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cua_native.prompts.images import ImageSizing, PreparedImage, prepare_image

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def processor(tmp_path_factory: pytest.TempPathFactory):
    """The tiny Qwen3-VL processor (patch 16, merge 2), loaded from disk."""
    from transformers import AutoProcessor

    from cua_native.models.tiny import build_processor, build_tokenizer

    directory = tmp_path_factory.mktemp("tiny_qwen3_vl_processor")
    build_processor(build_tokenizer()).save_pretrained(directory)
    return AutoProcessor.from_pretrained(directory)


@pytest.fixture(scope="session")
def qwen25_processor(processor):
    """A Qwen2.5-VL processor (patch 14: factor 28, CLIP mean/std) on the same tokenizer."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessorFast

    image_processor = Qwen2VLImageProcessorFast(
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
        min_pixels=16 * 28 * 28,
        max_pixels=128 * 28 * 28,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
    )
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=processor.tokenizer,
        video_processor=processor.video_processor,
        chat_template=processor.chat_template,
    )


def png_bytes(
    width: int, height: int, color: tuple[int, ...] = (40, 90, 200), mode: str = "RGB"
) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


def noisy_screen(seed: int, width: int = 1080, height: int = 2400) -> Image.Image:
    """A deterministic screenshot with content in every pixel (normalisation is exercised)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


SMALL = ImageSizing(factor=32, min_pixels=16 * 32 * 32, max_pixels=128 * 32 * 32)


def prepared(width: int = 1080, height: int = 2400, shade: int = 0) -> PreparedImage:
    """A prepared screenshot of the tiny model's size; ``shade`` makes images distinct."""
    return prepare_image(Image.new("RGB", (width, height), (shade % 256, 80, 160)), SMALL)


@pytest.fixture(scope="session")
def screens() -> list[Image.Image]:
    """Six distinct 1080x2400 screenshots, made once per session."""
    return [noisy_screen(seed) for seed in range(6)]


@pytest.fixture
def make_shots(screens) -> Callable[[ImageSizing, int], list[PreparedImage]]:
    """Fresh ``PreparedImage``s (empty caches) of the session screenshots."""

    def make(sizing: ImageSizing, n: int) -> list[PreparedImage]:
        return [prepare_image(screens[i % len(screens)], sizing) for i in range(n)]

    return make


@pytest.fixture(scope="session")
def make_prepared():
    return prepared


@pytest.fixture(scope="session")
def make_png():
    return png_bytes
