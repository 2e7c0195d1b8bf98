"""The CPU path with and without the vision cache, side by side (tiny Qwen3-VL).

An episode of MAI-UI turns from the real prompt builder (a window of three 1080x2400
screenshots at the tiny pixel budget) goes through two engines, one with the vision cache
(the default) and one without (``vision_cache_mb=0``), turn by turn alternating which goes
first, so a loaded machine slows both alike. Prints the median time to first token and the
median turn latency of each and their ratios (cache / no cache; below 1 is faster), and
checks both sampled the same tokens.

    uv run python bench/perf/vision_cache_cpu.py [--turns 12] [--new-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import tempfile
from pathlib import Path

import torch
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image, ImageDraw
from transformers import AutoModelForImageTextToText, AutoProcessor

from cua_native.actions.dialects import get_dialect
from cua_native.engine import InProcessEngine, InProcessEngineConfig
from cua_native.gym.protocol import Screenshot, Task
from cua_native.models.tiny import build_tiny_qwen3_vl
from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config

CLICK = (
    "<thinking>\nTap\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)


def screen(seed: int) -> Image.Image:
    image = Image.new("RGB", (1080, 2400), (20 + 7 * seed % 200, 120, 200))
    draw = ImageDraw.Draw(image)
    for row in range(6):
        draw.rectangle((60, 200 + 330 * row, 1020, 380 + 330 * row), fill=(seed * 31 % 255, 90, 40))
    return image


async def run(args: argparse.Namespace, directory: Path) -> None:
    processor = AutoProcessor.from_pretrained(directory)
    model = AutoModelForImageTextToText.from_pretrained(directory, dtype=torch.float32).eval()
    engines = {
        "cache": InProcessEngine(copy.deepcopy(model), processor, config=InProcessEngineConfig()),
        "no_cache": InProcessEngine(
            copy.deepcopy(model), processor, config=InProcessEngineConfig(vision_cache_mb=0)
        ),
    }
    builder = PromptBuilder(default_prompt_config("mai_ui"), processor, encode_images=False)
    gconfig = GenerationHyperparameters(
        max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True
    )
    ttft: dict[str, list[float]] = {k: [] for k in engines}
    latency: dict[str, list[float]] = {k: [] for k in engines}
    history: list[HistoryStep] = []
    same = True
    try:
        for engine in engines.values():
            engine.initialize()
        for i in range(args.turns + 1):
            current = await builder.prepare_image(Screenshot(image=screen(i)))
            built = await builder.build(
                Task(task_id="cpu", instruction="Open Settings"), history[-2:], current, gconfig
            )
            order = list(engines) if i % 2 == 0 else list(reversed(engines))
            outputs = {}
            for name in order:
                resp = await engines[name].agenerate(built.request)
                outputs[name] = resp.output_tokens
                if i > 0:  # the first turn warms both up
                    ttft[name].append(resp.ttft)
                    latency[name].append(resp.latency)
            same = same and outputs["cache"] == outputs["no_cache"]
            history.append(HistoryStep(current, get_dialect("mai_ui").parse(CLICK), CLICK))
    finally:
        for engine in engines.values():
            engine.destroy()
    for name in engines:
        print(
            f"{name:>9}: time to first token {1000 * statistics.median(ttft[name]):7.1f} ms, "
            f"turn {1000 * statistics.median(latency[name]):7.1f} ms (median of {args.turns})"
        )
    print(
        "cache / no cache: time to first token x"
        f"{statistics.median(ttft['cache']) / statistics.median(ttft['no_cache']):.2f}, turn x"
        f"{statistics.median(latency['cache']) / statistics.median(latency['no_cache']):.2f}; "
        f"same tokens: {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = build_tiny_qwen3_vl(Path(tmp) / "tiny")
        asyncio.run(run(args, directory))


if __name__ == "__main__":
    main()
