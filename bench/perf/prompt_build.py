"""Prompt build per turn at the real size, the previous builder and this one side by side.

What an in-process turn costs on the CPU before the engine sees it: ``PromptBuilder.build_turn``
(``encode_images=False``) on a new screenshot, the history's screenshots already prepared.
Qwen3-VL's real pixel budget (65536..16777216 px: a 1080x2400 phone screenshot becomes
1088x2400, 10,200 patches, 2,550 tokens; a 1920x1080 desktop 1920x1088), the tiny model's
processor (the same image processor class and template as the checkpoints'), noise screenshots
with bars (``bench/gpu/gpu_check.py``'s kind). Each turn both builders take the same screenshot,
interleaved (which side goes first alternates turn by turn), so machine load hits them alike;
every turn's ids and tensors are checked equal. Every screenshot's rows stay referenced for the
whole run, as an episode's turns keep theirs for training, so each turn's rows are a fresh
buffer on both sides.

* ``old``: the builder before this change, with the same ``image_threads``: ``PixelKernel``'s
  previous body (``ChunkedKernel`` below: the band's uint8 patches reordered whole, float32
  chunks, one strided copy per temporal frame, the output from ``np.empty``).
* ``new``: the builder as it is (``PixelKernel``: reorder and normalise per row of merge blocks
  in cache, both temporal frames in one sequential write, the output from ``torch.empty``).
* ``--aa``: both sides the builder as it is (an A/A control: the harness's own bias).

Then, unless ``--no-kernel``, the rows of one 1088x2400 screenshot alone: both kernels on fresh
buffers (kept, as above), the new one into a buffer already written (its arithmetic alone), and
a fresh 63 MB buffer's first touch on its own from ``np.empty`` (huge-page advice) and from
``torch.empty``, written on the same threads.

The process is set up as ``train``/``evaluate`` set up theirs (``tune_for_rollouts``: glibc
keeps blocks up to 32 MiB in its heap, so the 63 MB rows are still fresh mappings).

Workloads: ``mai_ui`` (3 screenshots a prompt), ``qwen3_vl`` (1); ``--pad N``: the instruction
grows by N sentences a turn as in ``bench/gpu/gpu_prefill.py`` (prompts of 10k..29k tokens: each
turn then tokenizes text it has not seen), 0 keeps it fixed as in a real episode.

    uv run python bench/perf/prompt_build.py [--turns 20] [--pad 70] [--threads 4] [--aa]
        [--no-kernel] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image, ImageDraw

from cua_native.actions.dialects import get_dialect
from cua_native.gym.protocol import Screenshot, Task
from cua_native.prompts import BuiltPrompt, HistoryStep, PromptBuilder, default_prompt_config
from cua_native.prompts.pixels import ROWS_PER_CHUNK, ImageFeatures, PixelKernel

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


class ChunkedKernel(PixelKernel):
    """The previous ``PixelKernel.rows`` (main before this change), kept here as the baseline:
    the same bands, uint8 reorder and float32 chunks, each temporal frame written by its own
    strided copy."""

    def rows(self, pixels: np.ndarray, threads: int = 1) -> ImageFeatures:
        patch, merge, temporal = self.patch, self.merge, self.temporal
        height, width, channels = pixels.shape
        grid_h, grid_w = height // patch, width // patch
        count = grid_h * grid_w
        per_band = grid_w * merge
        blocks = pixels.reshape(
            grid_h // merge, merge, patch, grid_w // merge, merge, patch, channels
        )
        rows = np.empty((count, channels, temporal, patch * patch), dtype=np.float32)

        def fill(band: tuple[int, int]) -> None:
            lo, hi = band
            ordered = np.ascontiguousarray(blocks[lo:hi].transpose(0, 3, 1, 4, 6, 2, 5))
            ordered = ordered.reshape(-1, channels, patch * patch)
            out = rows[lo * per_band : hi * per_band]
            scratch = np.empty((min(ROWS_PER_CHUNK, len(ordered)), *ordered.shape[1:]), np.float32)
            for start in range(0, len(ordered), ROWS_PER_CHUNK):
                stop = min(start + ROWS_PER_CHUNK, len(ordered))
                values = scratch[: stop - start]
                np.copyto(values, ordered[start:stop])
                self.normalization.apply(values)
                for frame in range(temporal):
                    out[start:stop, :, frame] = values

        bands = grid_h // merge
        split = max(1, min(threads, bands))
        ranges = list(pairwise(bands * i // split for i in range(split + 1)))
        if split == 1:
            fill(ranges[0])
        else:
            with ThreadPoolExecutor(split, thread_name_prefix="pixels") as pool:
                list(pool.map(fill, ranges))
        grid = torch.tensor([[1, grid_h, grid_w]], dtype=torch.long)
        return ImageFeatures(
            pixel_values=torch.from_numpy(rows.reshape(count, -1)), image_grid_thw=grid
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
    old = Side(PromptBuilder(config, processor, encode_images=False, image_threads=args.threads))
    if not args.aa:
        old.builder.pixel_kernel = ChunkedKernel.build(processor.image_processor)
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


def timed(fn: Any) -> tuple[float, float]:
    """Wall and process CPU seconds of ``fn()``."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def first_touch(buffer: np.ndarray, threads: int) -> np.ndarray:
    """Write every byte of ``buffer`` once, in ``threads`` bands on threads as the kernel does;
    returns it."""
    if threads == 1:
        buffer.fill(1.0)
        return buffer
    cuts = list(pairwise(len(buffer) * i // threads for i in range(threads + 1)))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda cut: buffer[cut[0] : cut[1]].fill(1.0), cuts))
    return buffer


def huge_page_settings() -> dict[str, str]:
    """The kernel's transparent-huge-page settings (``enabled``, ``defrag``; "unknown" off
    Linux): whether NumPy's huge-page advice can stall a first touch."""
    settings = {}
    for name in ("enabled", "defrag"):
        try:
            text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
        except OSError:
            text = "unknown"
        settings[name] = text.strip()
    return settings


def kernel_alone(processor: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The rows of one 1088x2400 screenshot, each case ``args.turns`` times, interleaved; every
    fresh buffer kept until the end (as a turn's rows are)."""
    image_processor = processor.image_processor
    new = PixelKernel.for_image_processor(image_processor)
    assert new is not None
    old = ChunkedKernel.build(image_processor)
    pixels = np.asarray(screenshot(0, (1088, 2400)), dtype=np.uint8)
    expected = old.rows(pixels).pixel_values
    warm = torch.empty_like(expected)
    warm.fill_(0.0)
    count, width = expected.shape
    threads = args.threads
    kept: list[Any] = []  # every result, so each fresh buffer stays allocated

    cases: dict[str, Any] = {
        "old kernel, fresh output": lambda: old.rows(pixels, threads),
        "new kernel, fresh output": lambda: new.rows(pixels, threads),
        "new kernel, written output": lambda: new.rows(pixels, threads, out=warm),
        "first touch, np.empty": lambda: first_touch(np.empty(count * width, np.float32), threads),
        "first touch, torch.empty": lambda: first_touch(
            torch.empty(count * width).numpy(), threads
        ),
        "second touch (written)": lambda: first_touch(warm.numpy().reshape(-1), threads),
    }
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    for index in range(args.turns):
        names = list(cases) if index % 2 else list(reversed(cases))
        for name in names:
            wall, cpu = timed(lambda: kept.append(cases[name]()))  # noqa: B023 (called now)
            walls[name].append(wall)
            cpus[name].append(cpu)
            result = kept[-1]
            if isinstance(result, ImageFeatures) and not torch.equal(result.pixel_values, expected):
                raise SystemExit(f"kernel alone: {name}: rows differ from the old kernel's")
    return {
        "threads": threads,
        "transparent_hugepage": huge_page_settings(),
        "rows": count,
        "megabytes": expected.numel() * 4 / 1e6,
        "cases": {
            name: {"p50_ms": pct(walls[name], 0.5), "cpu_p50_ms": pct(cpus[name], 0.5)}
            for name in cases
        },
    }


def show(result: dict[str, Any], threads: int, aa: bool) -> None:
    w, h = result["screenshot"]
    mw, mh = result["model_image"]
    print(
        f"\n{result['family']} {w}x{h} -> {mw}x{mh}, {result['images']} image(s), "
        f"{result['prompt_tokens']} tokens, {result['turns']} turns; "
        f"{threads} image thread(s){'; A/A control: both sides the current builder' if aa else ''}; "
        "ids and tensors identical every turn"
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
    parser.add_argument("--threads", type=int, default=None, help="both builders' image_threads")
    parser.add_argument(
        "--workloads", default="mai_ui:1080x2400,qwen3_vl:1080x2400,mai_ui:1920x1080"
    )
    parser.add_argument("--aa", action="store_true", help="both sides the current builder")
    parser.add_argument(
        "--no-kernel", dest="kernel", action="store_false", help="skip the rows-alone section"
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
    torch.set_num_threads(1)  # this process's torch ops stay on their calling thread
    from cua_native.models.tiny import TinySpec, build_processor, build_tokenizer
    from cua_native.rollout.runtime import tune_for_rollouts

    tune_for_rollouts()  # the allocator and GIL settings of train/evaluate's rollout processes

    processor = build_processor(build_tokenizer(), TinySpec(**REAL_PIXELS))
    threads = PromptBuilder(default_prompt_config("mai_ui"), processor).image_threads
    args.threads = args.threads or threads
    report: dict[str, Any] = {
        "image_threads": args.threads,
        "pad": args.pad,
        "aa_control": args.aa,
        "results": [],
    }
    for family, size in specs:
        result = asyncio.run(workload(processor, family, size, args))
        report["results"].append(result)
        show(result, args.threads, args.aa)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    ratios = [r["ratio_p50"] for r in report["results"]]
    print(f"\nmedian of the workloads' p50 ratios: x{statistics.median(ratios):.2f}")
    if args.kernel:
        alone = kernel_alone(processor, args)
        report["kernel_alone"] = alone
        print(
            f"\nrows of one 1088x2400 screenshot alone ({alone['rows']} rows, "
            f"{alone['megabytes']:.1f} MB, {alone['threads']} thread(s), {args.turns} times; "
            f"transparent huge pages {alone['transparent_hugepage']})"
        )
        for name, case in alone["cases"].items():
            print(f"  {name:<30}p50 {case['p50_ms']:7.1f} ms, CPU {case['cpu_p50_ms']:7.1f} ms")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
