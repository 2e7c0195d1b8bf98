"""Prompt build per turn at the real size, the previous builder and this one side by side.

What an in-process turn costs on the CPU before the engine sees it: ``PromptBuilder.build_turn``
(``encode_images=False``) on a new screenshot, the history's screenshots already prepared.
Qwen3-VL's real pixel budget (65536..16777216 px: a 1080x2400 phone screenshot becomes
1088x2400, 10,200 patches, 2,550 tokens; a 1920x1080 desktop 1920x1088), the tiny model's
processor (the same image processor class and template as the checkpoints'), noise screenshots
with bars (``bench/gpu/gpu_check.py``'s kind). Each turn both builders take the same screenshot,
interleaved, so machine load hits them alike; every turn's ids and tensors are checked equal.

* ``old``: the builder before issue 41's prompt work: the pixel rows by a 256-entry table per
  channel (``np.take``: an intp copy of the indices, a strided write, a copy for the temporal
  frame), the resize in one call.
* ``new``: the builder as it is (``PixelKernel``: rows cast and normalised in cache-sized
  chunks, each output byte written once; ``image_threads`` bands for the resize and the rows).

Workloads: ``mai_ui`` (3 screenshots a prompt), ``qwen3_vl`` (1); ``--pad N``: the instruction
grows by N sentences a turn as in ``bench/gpu/gpu_prefill.py`` (prompts of 10k..29k tokens: each
turn then tokenizes text it has not seen), 0 keeps it fixed as in a real episode.

    uv run python bench/perf/prompt_build.py [--turns 20] [--pad 70] [--threads 4] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image, ImageDraw

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import BuiltPrompt, HistoryStep, PromptBuilder, default_prompt_config
from cua_native.prompts.pixels import ImageFeatures

REAL_PIXELS = {"min_pixels": 65536, "max_pixels": 16777216}
PHASES = ("decode", "resize", "pixels", "template_tokenize", "assemble", "request")
INSTRUCTION = "Open Settings, turn on Wi-Fi and come back to the home screen."
ANSWERS = {
    "mai_ui": (
        "<thinking>\nTap the Wi-Fi toggle\n</thinking>\n<tool_call>\n"
        '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n'
        "</tool_call>"
    ),
    "qwen3_vl": (
        'Thought: tap\nAction: "Tap the Wi-Fi toggle."\n<tool_call>\n'
        '{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [447, 81]}}'
        "\n</tool_call>"
    ),
}
WARMUP = 3


class TableKernel:
    """The previous ``PixelKernel`` (table lookups), kept here as the baseline."""

    def __init__(self, image_processor: Any, channels: int = 3) -> None:
        ip = image_processor
        self.patch, self.merge = int(ip.patch_size), int(ip.merge_size)
        self.temporal = int(ip.temporal_patch_size)
        values = np.repeat(np.arange(256, dtype=np.float32)[:, None], channels, axis=1)
        mean = np.asarray(ip.image_mean, dtype=np.float32).reshape(-1)
        std = np.asarray(ip.image_std, dtype=np.float32).reshape(-1)
        if ip.do_rescale:
            scale = np.float32(1.0 / ip.rescale_factor)
            mean, std = mean * scale, std * scale
        self.table = (values - mean) / std

    def rows(self, pixels: np.ndarray, threads: int = 1) -> ImageFeatures:
        """The previous kernel's body (one thread, whatever ``threads`` says)."""
        patch, merge, temporal = self.patch, self.merge, self.temporal
        height, width, channels = pixels.shape
        grid_h, grid_w = height // patch, width // patch
        blocks = pixels.reshape(
            grid_h // merge, merge, patch, grid_w // merge, merge, patch, channels
        )
        ordered = np.ascontiguousarray(blocks.transpose(0, 3, 1, 4, 6, 2, 5))
        ordered = ordered.reshape(grid_h * grid_w, channels, patch * patch)
        rows = np.empty((grid_h * grid_w, channels, temporal, patch * patch), dtype=np.float32)
        for channel in range(channels):
            np.take(self.table[:, channel], ordered[:, channel], out=rows[:, channel, 0])
        rows[:, :, 1:] = rows[:, :, :1]
        grid = torch.tensor([[1, grid_h, grid_w]], dtype=torch.long)
        return ImageFeatures(
            pixel_values=torch.from_numpy(rows.reshape(grid_h * grid_w, -1)), image_grid_thw=grid
        )


def screenshot(seed: int, size: tuple[int, int]) -> Image.Image:
    """A screenshot with noise and a few bars, different for every seed."""
    image = Image.effect_noise(size, 30 + seed % 17).convert("RGB")
    draw = ImageDraw.Draw(image)
    for row in range(6):
        top = (200 + 330 * row + 13 * seed % 90) * size[1] // 2400
        shade = (40 * row + 31 * seed) % 255
        draw.rectangle((60, top, size[0] - 60, top + 180), fill=(shade, 255 - shade, 120))
    return image


@dataclass
class Side:
    builder: PromptBuilder
    history: list[HistoryStep] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})


async def turn(
    side: Side, family: str, image: Image.Image, task: Task, record: bool
) -> BuiltPrompt:
    gconfig = GenerationHyperparameters(max_new_tokens=64)
    timings: dict[str, float] = {}
    start, cpu_start = time.perf_counter(), time.process_time()
    built = await side.builder.build_turn(
        task, side.history[-2:], Screenshot(image=image), gconfig, timings=timings
    )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    assert built.current is not None
    answer = ANSWERS[family]
    side.history.append(HistoryStep(built.current, get_dialect(family).parse(answer), answer))
    if record:
        side.totals.append(elapsed)
        side.cpu.append(cpu)
        for phase in PHASES:
            side.phases[phase].append(timings.get(phase, 0.0))
    return built


def same(a: BuiltPrompt, b: BuiltPrompt) -> bool:
    """Ids, token types and each image's rows and grid equal (image by image: concatenating
    a 3-image prompt's 186 MB of rows twice a turn would churn memory under the timed turns,
    which the engine's own path does not)."""
    if a.input_ids != b.input_ids or len(a.pixels.features) != len(b.pixels.features):
        return False
    key = "mm_token_type_ids"
    if not torch.equal(a.multi_modal_input[key], b.multi_modal_input[key]):
        return False
    return all(
        x.pixel_values.dtype == y.pixel_values.dtype
        and torch.equal(x.pixel_values, y.pixel_values)
        and torch.equal(x.image_grid_thw, y.image_grid_thw)
        and x.content_key == y.content_key
        for x, y in zip(a.pixels.features, b.pixels.features, strict=True)
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def workload(
    processor: Any, family: str, size: tuple[int, int], args: argparse.Namespace
) -> dict[str, Any]:
    config = default_prompt_config(family, **REAL_PIXELS)
    old = Side(PromptBuilder(config, processor, encode_images=False, image_threads=1))
    old.builder.pixel_kernel = TableKernel(processor.image_processor)  # type: ignore[assignment]
    new = Side(PromptBuilder(config, processor, encode_images=False, image_threads=args.threads))
    for index in range(args.turns + WARMUP):
        image = screenshot(index, size)
        instruction = INSTRUCTION + " Then go back." * (args.pad * index)
        task = Task(task_id=f"bench-{family}", instruction=instruction)
        record = index >= WARMUP
        # alternate which side goes first, so neither always finds the caches warm
        sides = (old, new) if index % 2 else (new, old)
        built = [await turn(side, family, image, task, record) for side in sides]
        if not same(*built):
            raise SystemExit(f"{family} {size}: turn {index} differs between old and new")
    prompt = built[0]
    size_seen = prompt.images[-1].model_size
    out: dict[str, Any] = {
        "family": family,
        "screenshot": list(size),
        "model_image": list(size_seen),
        "images": len(prompt.images),
        "prompt_tokens": len(prompt.input_ids),
        "turns": args.turns,
        "identical": True,
    }
    for name, side in (("old", old), ("new", new)):
        out[name] = {
            "p50_ms": pct(side.totals, 0.5),
            "p99_ms": pct(side.totals, 0.99),
            "cpu_p50_ms": pct(side.cpu, 0.5),
            "phases_p50_ms": {p: pct(side.phases[p], 0.5) for p in PHASES},
        }
    out["ratio_p50"] = out["old"]["p50_ms"] / out["new"]["p50_ms"]
    return out


def show(result: dict[str, Any], threads: int) -> None:
    w, h = result["screenshot"]
    mw, mh = result["model_image"]
    print(
        f"\n{result['family']} {w}x{h} -> {mw}x{mh}, {result['images']} image(s), "
        f"{result['prompt_tokens']} tokens, {result['turns']} turns; new with "
        f"{threads} image thread(s); ids and tensors identical every turn"
    )
    print(f"  {'ms per turn':<18}{'old':>10}{'new':>10}")
    for phase in PHASES:
        a, b = result["old"]["phases_p50_ms"][phase], result["new"]["phases_p50_ms"][phase]
        print(f"  {phase + ' p50':<18}{a:10.1f}{b:10.1f}")
    for key in ("p50_ms", "p99_ms", "cpu_p50_ms"):
        label = "total " + key.rsplit("_", 1)[0].replace("_", " ")
        print(f"  {label:<18}{result['old'][key]:10.1f}{result['new'][key]:10.1f}")
    print(f"  old / new p50: x{result['ratio_p50']:.2f} (goal: new <= 50 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--pad", type=int, default=70, help="instruction growth per turn")
    parser.add_argument("--threads", type=int, default=None, help="new builder's image_threads")
    parser.add_argument(
        "--workloads", default="mai_ui:1080x2400,qwen3_vl:1080x2400,mai_ui:1920x1080"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.turns < 1 or args.pad < 0 or (args.threads is not None and args.threads < 1):
        raise SystemExit("--turns and --threads must be >= 1, --pad >= 0")
    specs = []
    for item in args.workloads.split(","):
        family, _, size = item.partition(":")
        if family not in ANSWERS or "x" not in size:
            raise SystemExit(f"bad workload {item!r}: FAMILY:WxH, FAMILY one of {list(ANSWERS)}")
        width, height = (int(v) for v in size.split("x"))
        specs.append((family, (width, height)))
    torch.set_num_threads(1)
    from cua_native.models.tiny import TinySpec, build_processor, build_tokenizer

    processor = build_processor(build_tokenizer(), TinySpec(**REAL_PIXELS))
    threads = PromptBuilder(default_prompt_config("mai_ui"), processor).image_threads
    args.threads = args.threads or threads
    report: dict[str, Any] = {"image_threads": args.threads, "pad": args.pad, "results": []}
    for family, size in specs:
        result = asyncio.run(workload(processor, family, size, args))
        report["results"].append(result)
        show(result, args.threads)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    print(
        f"\nmedian of the workloads' p50 ratios: x{statistics.median(r['ratio_p50'] for r in report['results']):.2f}"
    )


if __name__ == "__main__":
    main()
