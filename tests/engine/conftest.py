"""Shared fixtures: one tiny Qwen3-VL built per session, a fresh engine per test."""

from __future__ import annotations

import base64
import copy
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from cua_native.engine import InProcessEngine, InProcessEngineConfig
from cua_native.models.tiny import build_tiny_qwen3_vl


@dataclass(frozen=True)
class Tiny:
    path: Path
    model: Any
    processor: Any

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The tiny model with its default tokenizer (not the commands' prompt-trained one of
    ``tests/conftest.py``): the engine's behaviour tests pin its greedy outputs."""
    path = build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny_qwen3_vl"))
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return Tiny(path=path, model=model, processor=AutoProcessor.from_pretrained(path))


def make_engine(tiny: Tiny, **config: Any) -> InProcessEngine:
    """A started engine on the tiny model. Overlapped decode and stacked projections are on
    unless a test says otherwise: they are the path CUDA takes by default, and on CPU only
    tests reach them (``test_overlap.py`` and ``test_stacked_weights.py`` compare them with
    the plain step)."""
    config.setdefault("overlap_decode", True)
    config.setdefault("stack_projections", True)
    engine = InProcessEngine(
        copy.deepcopy(tiny.model), tiny.processor, config=InProcessEngineConfig(**config)
    )
    engine.initialize()
    return engine


@pytest.fixture
def engine(tiny: Tiny) -> Iterator[InProcessEngine]:
    eng = make_engine(tiny)
    try:
        yield eng
    finally:
        eng.destroy()


def screenshot(color: tuple[int, int, int] = (20, 120, 200), size=(1080, 2400)) -> Image.Image:
    image = Image.new("RGB", size, color)
    for x in range(0, size[0], 90):  # some structure so patches differ
        image.paste((255 - color[0], color[1], 30), (x, x, x + 40, x + 200))
    return image


def b64_png(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def vision_request(
    tiny: Tiny, gconfig: GenerationHyperparameters, text: str = "Open Settings", **meta: Any
) -> ModelRequest:
    """A prompt built the way the prompt teammate does: processor output in metadata."""
    image = screenshot()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    rendered = tiny.processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    out = tiny.processor(text=[rendered], images=[image], return_tensors="pt")
    return ModelRequest(
        input_ids=out["input_ids"][0].tolist(),
        image_data=[b64_png(image)],
        processor=tiny.processor,
        tokenizer=tiny.tokenizer,
        gconfig=gconfig,
        metadata={
            "multi_modal_input": {
                "pixel_values": out["pixel_values"],
                "image_grid_thw": out["image_grid_thw"],
            },
            **meta,
        },
    )


def text_request(
    tiny: Tiny, gconfig: GenerationHyperparameters, text: str = "Go home.", **meta: Any
) -> ModelRequest:
    messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    ids = tiny.processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    ids = ids[0] if ids and isinstance(ids[0], list) else ids
    return ModelRequest(
        input_ids=list(ids), tokenizer=tiny.tokenizer, gconfig=gconfig, metadata=dict(meta)
    )


@torch.no_grad()
def reference_logprobs(
    model: Any, req: ModelRequest, output: list[int], temperature: float
) -> torch.Tensor:
    """ONE plain forward over prompt + output: ``log_softmax(logits/T)`` at each output token."""
    full = torch.tensor([list(req.input_ids) + list(output)])
    kwargs: dict[str, torch.Tensor] = {}
    mm = req.metadata.get("multi_modal_input")
    if mm is not None:
        types = torch.zeros_like(full)
        types[full == model.config.image_token_id] = 1
        kwargs = {
            "pixel_values": mm["pixel_values"],
            "image_grid_thw": mm["image_grid_thw"],
            "mm_token_type_ids": types,
        }
    model.model.rope_deltas = None  # the model caches this between calls
    logits = model(input_ids=full, **kwargs).logits[0].float()
    t = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits / t, dim=-1)
    n = len(req.input_ids)
    positions = torch.arange(n - 1, n - 1 + len(output))
    return logprobs[positions, torch.tensor(output)]


class Kit:
    """Helpers handed to tests as a fixture (importlib mode cannot import conftest)."""

    def __init__(self, tiny: Tiny) -> None:
        self.tiny = tiny

    def engine(self, **config: Any) -> InProcessEngine:
        return make_engine(self.tiny, **config)

    def vision_request(
        self, gconfig: GenerationHyperparameters, text: str = "Open Settings", **meta: Any
    ) -> ModelRequest:
        return vision_request(self.tiny, gconfig, text, **meta)

    def text_request(
        self, gconfig: GenerationHyperparameters, text: str = "Go home.", **meta: Any
    ) -> ModelRequest:
        return text_request(self.tiny, gconfig, text, **meta)

    def reference(
        self, req: ModelRequest, output: list[int], temperature: float, model: Any = None
    ) -> torch.Tensor:
        return reference_logprobs(model or self.tiny.model, req, output, temperature)

    @staticmethod
    def screenshot(*args: Any, **kwargs: Any) -> Image.Image:
        return screenshot(*args, **kwargs)

    @staticmethod
    def b64_png(image: Image.Image) -> str:
        return b64_png(image)


@pytest.fixture(scope="session")
def kit(tiny: Tiny) -> Kit:
    return Kit(tiny)
