"""Time per turn to build a prompt: decode, resize, encode, template + processor.

1080x2400 PNG screenshots, MAI-UI layout with 3 images (2 past + current), one CPU thread.
Runs with the tiny model's processor settings and with Qwen3-VL's real defaults
(min 65536 / max 16777216 pixels, so 2400x1088: 2550 image tokens each).

    uv run python bench/prompt.py [--turns 30]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import tempfile
import time

import torch
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Task
from cua_native.models.tiny import build_tiny_qwen3_vl
from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config
from cua_native.prompts.images import prepare_image

CLICK = (
    "<thinking>\nTap the Wi-Fi toggle\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)


def screenshot_png(seed: int) -> bytes:
    noise = Image.effect_noise((1080, 2400), 40 + seed % 20).convert("RGB")
    buffer = io.BytesIO()
    noise.save(buffer, format="PNG")
    return buffer.getvalue()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


async def run(label: str, processor, turns: int, **overrides) -> None:
    builder = PromptBuilder(default_prompt_config("mai_ui", **overrides), processor)
    dialect = get_dialect("mai_ui")
    pngs = [screenshot_png(i) for i in range(4)]
    task = Task(task_id="bench", instruction="Turn on Wi-Fi and open Settings")
    gconfig = GenerationHyperparameters(max_new_tokens=64)
    phases: dict[str, list[float]] = {
        k: [] for k in ("decode", "resize", "encode", "build", "total")
    }
    history: list[HistoryStep] = []
    for turn in range(turns + 3):
        timings: dict[str, float] = {}
        start = time.perf_counter()
        current = prepare_image(pngs[turn % 4], builder.sizing, timings=timings)
        prepared = time.perf_counter()
        built = await builder.build(task, history[-2:], current, gconfig)
        done = time.perf_counter()
        history.append(HistoryStep(current, dialect.parse(CLICK), CLICK))
        if turn < 3:
            continue  # warm-up; from here on 3 images per prompt
        assert len(built.images) == 3
        for key in ("decode", "resize", "encode"):
            phases[key].append(timings[key])
        phases["build"].append(done - prepared)
        phases["total"].append(done - start)
    size = built.images[-1].model_size
    print(
        f"\n{label}: model image {size[0]}x{size[1]}, prompt {len(built.input_ids)} tokens, "
        f"{turns} turns, 1 thread"
    )
    for key, values in phases.items():
        print(
            f"  {key:<7} p50 {pct(values, 0.5):7.1f} ms   p95 {pct(values, 0.95):7.1f} ms"
            f"   mean {statistics.fmean(values) * 1000:7.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoProcessor

    with tempfile.TemporaryDirectory() as directory:
        processor = AutoProcessor.from_pretrained(build_tiny_qwen3_vl(directory))
    print(
        "build = template + token count + processor (+ request); per turn only the current "
        "screenshot is decoded/resized/encoded, past ones are reused"
    )
    asyncio.run(run("tiny defaults (16..128 x 32^2 px)", processor, args.turns))
    asyncio.run(
        run(
            "Qwen3-VL defaults (65536..16777216 px)",
            processor,
            max(5, args.turns // 3),
            min_pixels=65536,
            max_pixels=16777216,
        )
    )


if __name__ == "__main__":
    main()
