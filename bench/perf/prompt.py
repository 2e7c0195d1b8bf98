"""Time per turn to build a prompt, fast path vs the processor-every-turn path, side by side.

1080x2400 PNG screenshots (noise: a worst case for decode and PNG encode), MAI-UI layout with
3 images (2 past + current), one CPU thread. Each turn, every mode prepares the same new
screenshot and builds its prompt (modes interleaved, so machine load hits them alike):

* ``processor``: ``PromptBuilder(use_processor=True)``, the processor on the whole prompt every
  turn (all history images re-normalised, all pads re-tokenized), PNGs for remote engines.
* ``fast``: cached per-image tensors, pads expanded by hand, no PNG (in-process engine).
* ``fast+png``: the same plus the PNG/base64 for AReaL's remote engines (``image_data``).

Phases: decode (PNG bytes; the simulator hands over PIL images and skips it), resize, pixels
(image processor on the new screenshot), encode (PNG), template+tokenize, assemble (pad
expansion + tensor concat; the processor run in ``processor`` mode), request, total.
Settings: the tiny model's (16..128 x 32^2 px: 224x512 images) and Qwen3-VL's real defaults
(65536..16777216 px: 1088x2400 images, 2550 tokens each).

    uv run python bench/perf/prompt.py [--turns 30]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
import time
from dataclasses import dataclass, field

import torch
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image, ImageDraw

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import BuiltPrompt, HistoryStep, PromptBuilder, default_prompt_config
from cua_native.prompts.images import encode_png_base64

CLICK = (
    "<thinking>\nTap the Wi-Fi toggle\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)
PHASES = (
    "decode",
    "resize",
    "pixels",
    "encode",
    "template_tokenize",
    "assemble",
    "request",
    "total",
)
MODES = {
    "processor": {"use_processor": True},
    "fast": {"encode_images": False},
    "fast+png": {},
}
WARMUP = 3


@dataclass
class Mode:
    builder: PromptBuilder
    history: list[HistoryStep] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    last: BuiltPrompt | None = None


def screenshot_png(seed: int) -> bytes:
    noise = Image.effect_noise((1080, 2400), 40 + seed % 20).convert("RGB")
    buffer = io.BytesIO()
    noise.save(buffer, format="PNG")
    return buffer.getvalue()


def ui_screenshot_png() -> bytes:
    """A UI-like 1080x2400 screenshot (flat panels, text rows): how real screens compress."""
    image = Image.new("RGB", (1080, 2400), (245, 246, 250))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 1080, 90), fill=(30, 30, 40))
    for row in range(18):
        top = 140 + row * 125
        draw.rounded_rectangle((40, top, 1040, top + 105), 18, fill=(255, 255, 255))
        draw.ellipse((70, top + 22, 130, top + 82), fill=(60 + row * 9, 120, 200))
        draw.text((160, top + 30), f"Setting {row}: Wi-Fi, Bluetooth, display", fill=(20, 20, 20))
        draw.text((160, top + 62), "Tap to change this option", fill=(120, 120, 120))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def ui_codec_line(repeats: int = 20) -> str:
    """Decode (PNG bytes) and encode (PNG level 1) p50 of the UI-like screenshot."""
    data = ui_screenshot_png()
    decode, encode = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        image = Image.open(io.BytesIO(data))
        image.load()
        decoded = time.perf_counter()
        encode_png_base64(image.convert("RGB").resize((1088, 2400)))
        encode.append(time.perf_counter() - decoded)
        decode.append(decoded - start)
    return (
        f"UI-like 1080x2400 PNG ({len(data) // 1024} KiB): decode p50 {pct(decode, 0.5):.1f} ms, "
        f"PNG encode at 1088x2400 p50 {pct(encode, 0.5):.1f} ms (noise above is the worst case)"
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


async def turn(mode: Mode, png: bytes, task: Task, record: bool) -> None:
    gconfig = GenerationHyperparameters(max_new_tokens=64)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    current = await mode.builder.prepare_image(Screenshot(png=png), timings=timings)
    mode.last = await mode.builder.build(task, mode.history[-2:], current, gconfig, timings=timings)
    timings["total"] = time.perf_counter() - start
    mode.history.append(HistoryStep(current, get_dialect("mai_ui").parse(CLICK), CLICK))
    if record:
        assert len(mode.last.images) == 3
        for phase in PHASES:
            mode.samples[phase].append(timings.get(phase, 0.0))


async def run(label: str, processor, turns: int, **overrides) -> None:
    config = default_prompt_config("mai_ui", **overrides)
    modes = {name: Mode(PromptBuilder(config, processor, **kw)) for name, kw in MODES.items()}
    pngs = [screenshot_png(i) for i in range(4)]
    task = Task(task_id="bench", instruction="Turn on Wi-Fi and open Settings")
    for index in range(turns + WARMUP):
        for mode in modes.values():
            await turn(mode, pngs[index % 4], task, record=index >= WARMUP)
    built = modes["fast"].last
    assert built is not None and built.input_ids == modes["processor"].last.input_ids
    size = built.images[-1].model_size
    print(
        f"\n{label}: model image {size[0]}x{size[1]}, 3 images, prompt {len(built.input_ids)} "
        f"tokens, {turns} turns, 1 thread; ms p50 / p95"
    )
    print(f"  {'phase':<18}" + "".join(f"{name:>20}" for name in modes))
    for phase in PHASES:
        cells = "".join(
            f"{pct(m.samples[phase], 0.5):9.1f} /{pct(m.samples[phase], 0.95):8.1f}"
            for m in modes.values()
        )
        print(f"  {phase:<18}{cells}")
    reference = pct(modes["processor"].samples["total"], 0.5)
    for name in ("fast", "fast+png"):
        fast = pct(modes[name].samples["total"], 0.5)
        no_decode = fast - pct(modes[name].samples["decode"], 0.5)
        print(
            f"  speedup {name:<9} {reference / fast:5.1f}x total p50 "
            f"({fast:.1f} ms; {no_decode:.1f} ms without PNG decode, as with PIL screenshots)"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoProcessor

    from cua_native.models.tiny import build_processor, build_tokenizer

    with tempfile.TemporaryDirectory() as directory:
        build_processor(build_tokenizer()).save_pretrained(directory)
        processor = AutoProcessor.from_pretrained(directory)
    asyncio.run(run("tiny settings (16..128 x 32^2 px)", processor, args.turns))
    asyncio.run(
        run(
            "Qwen3-VL real sizes (65536..16777216 px)",
            processor,
            max(5, args.turns // 3),
            min_pixels=65536,
            max_pixels=16777216,
        )
    )
    print("\n" + ui_codec_line())


if __name__ == "__main__":
    main()
