"""Shared fixtures: a tiny local Qwen3-VL processor (real template, real Qwen3VLProcessor)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from cua_native.prompts.images import ImageSizing, PreparedImage, prepare_image

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cua_native.models.tiny import build_tiny_qwen3_vl

    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny_qwen3_vl"))


@pytest.fixture(scope="session")
def processor(tiny_dir: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_dir)


def png_bytes(
    width: int, height: int, color: tuple[int, ...] = (40, 90, 200), mode: str = "RGB"
) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


SMALL = ImageSizing(factor=32, min_pixels=16 * 32 * 32, max_pixels=128 * 32 * 32)


def prepared(width: int = 1080, height: int = 2400, shade: int = 0) -> PreparedImage:
    """A prepared screenshot of the tiny model's size; ``shade`` makes images distinct."""
    return prepare_image(Image.new("RGB", (width, height), (shade % 256, 80, 160)), SMALL)


@pytest.fixture(scope="session")
def make_prepared():
    return prepared


@pytest.fixture(scope="session")
def make_png():
    return png_bytes
