"""The in-process engine at concurrency on a GPU: time to first token, throughput, memory, the
vision cache, and prompt building, each figure beside its bound (issue 41's goals).

The model and prompts are ``bench/gpu/gpu_check.py``'s ``real`` section: a random Qwen3-VL with
2B-like sizes in bf16, MAI-UI prompts of three 1088x2400 screenshots (7,650 image tokens), turn
``i``'s instruction padded so prompts grow ~560 tokens a turn (10k..29k), 256 new tokens.
Two workloads of the same prompt lengths:

* ``episode``: turns 4.. of ONE episode (gpu_check's set): consecutive turns share two of their
  three screenshots, so the vision cache serves most images;
* ``distinct``: every request is the third turn of its own episode (three screenshots no other
  request shows): the cache cannot help; what is left is scheduling.

Measured, in one process:

* single turns: each of the 32 turns alone with one new token and an EMPTY vision cache (what a
  turn's prefill costs by itself); their sum is the denominator of the goal "median time to
  first token at 32 concurrent <= 0.3x the sum of the single-turn prefills". Turns 1-3 also on
  an engine without the cache (alternating), so batch-1 time to first token with and without
  it compare; then turns 1-6 one after another with the cache kept (an episode: two of three
  screenshots already encoded);
* batch-1 decode (256 tokens) against the HBM bound (text weights + the row's KV read once per
  step at the measured copy bandwidth);
* 8 and 32 concurrent turns of each workload (released together): wall, tok/s, median time to
  first token, peak memory, the vision encoder's share; beside the HBM bound of the decode
  alone and a bound that adds the prefill's FLOPs at the measured bf16 matmul rate;
* prompt build per turn at the real size (the builder's ``prepare_image`` + ``build``; the
  screenshot's synthesis not counted), phases from the builder's timings.

    bash .device/run.sh python3 bench/gpu/gpu_prefill.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from bench.gpu.gpu_check import (
    CLICK,
    INSTRUCTION,
    REAL_MAX_PIXELS,
    REAL_MIN_PIXELS,
    HbmBound,
    generate,
    peak_gib,
    real_size_model,
    reset_peak,
    screenshot,
    sync,
    timed_methods,
)
from cua_native.actions.dialects import get_dialect
from cua_native.engine import InProcessEngine, InProcessEngineConfig
from cua_native.engine.batch import BatchDecoder
from cua_native.engine.vision_cache import CachedVisionForward
from cua_native.gym.protocol import Screenshot, Task
from cua_native.models.tiny import TinySpec, build_processor, build_tokenizer
from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config

Figures = dict[str, Any]


# ---------------------------------------------------------------------------- prompts
def _gconfig(new_tokens: int) -> GenerationHyperparameters:
    return GenerationHyperparameters(max_new_tokens=new_tokens, ignore_eos=True, temperature=1.0)


def _instruction(turn: int, pad: int) -> str:
    return INSTRUCTION + " Then go back." * (pad * turn)  # pad 70: gpu_check's lengths


async def episode_turns(
    builder: PromptBuilder,
    n: int,
    args: argparse.Namespace,
    build_s: list[float],
    phases: list[Figures],
) -> list[ModelRequest]:
    """``n`` consecutive turns of one episode (gpu_check's ``build_prompts``), the builder's
    time per turn recorded (not the screenshot's synthesis)."""
    dialect = get_dialect("mai_ui")
    history: list[HistoryStep] = []
    out: list[ModelRequest] = []
    for i in range(n):
        image = screenshot(i)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        current = await builder.prepare_image(Screenshot(image=image), timings=timings)
        task = Task(task_id="gpu-prefill", instruction=_instruction(i, args.pad))
        built = await builder.build(
            task, history[-2:], current, _gconfig(args.new_tokens), timings=timings
        )
        build_s.append(time.perf_counter() - start)
        phases.append(timings)
        out.append(built.request)
        history.append(HistoryStep(current, dialect.parse(CLICK), CLICK))
    return out


async def distinct_turns(
    builder: PromptBuilder, turns: range, args: argparse.Namespace
) -> list[ModelRequest]:
    """For each turn index ``i``: the third turn of an episode of its own (screenshots no
    other request shows), with turn ``i``'s instruction (the same prompt length)."""
    dialect = get_dialect("mai_ui")
    out: list[ModelRequest] = []
    for i in turns:
        history: list[HistoryStep] = []
        for k in range(3):
            current = await builder.prepare_image(Screenshot(image=screenshot(1000 + 3 * i + k)))
            if k < 2:
                history.append(HistoryStep(current, dialect.parse(CLICK), CLICK))
        task = Task(task_id=f"gpu-prefill-{i}", instruction=_instruction(i, args.pad))
        built = await builder.build(task, history, current, _gconfig(args.new_tokens))
        out.append(built.request)
    return out


def one_token(req: ModelRequest) -> ModelRequest:
    return dataclasses.replace(req, gconfig=dataclasses.replace(req.gconfig, max_new_tokens=1))


# ---------------------------------------------------------------------------- bounds
@dataclasses.dataclass(frozen=True)
class FlopModel:
    """Prefill FLOPs of one prompt: linear layers 2 x params per token (text) or patch
    (vision), causal text attention 2 L^2 d per layer, vision attention 4 N^2 d per layer
    per image; and the measured bf16 matmul rate."""

    text_params: int
    text_layers: int
    text_width: int
    vision_params: int
    vision_layers: int
    vision_width: int
    peak_flop_s: float

    @classmethod
    def measure(cls, model: Any, device: torch.device) -> FlopModel:
        text = model.model.language_model
        visual = model.model.visual
        size = 8192 if device.type == "cuda" else 256
        a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
        b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
        for _ in range(3):
            a @ b
        sync(device)
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        sync(device)
        peak = 10 * 2 * size**3 / (time.perf_counter() - start)
        del a, b
        cfg, vcfg = text.config, visual.config
        return cls(
            text_params=sum(p.numel() for p in text.layers.parameters()),
            text_layers=cfg.num_hidden_layers,
            text_width=cfg.num_attention_heads * cfg.head_dim,
            vision_params=sum(p.numel() for p in visual.parameters()),
            vision_layers=vcfg.depth,
            vision_width=vcfg.hidden_size,
            peak_flop_s=peak,
        )

    def text(self, tokens: int) -> float:
        return 2 * self.text_params * tokens + 2 * self.text_layers * tokens**2 * self.text_width

    def image(self, patches: int) -> float:
        return 2 * self.vision_params * patches + 4 * self.vision_layers * patches**2 * (
            self.vision_width
        )


def prefill_flops(flops: FlopModel, reqs: list[ModelRequest], cached: bool) -> float:
    """Prefill FLOPs of ``reqs``; ``cached``: each distinct image counted once."""
    total = 0.0
    seen: set[bytes] = set()
    for req in reqs:
        total += flops.text(len(req.input_ids))
        mm = req.metadata["multi_modal_input"]
        pixels, grids = mm["pixel_values"], mm["image_grid_thw"]
        start = 0
        for grid in grids:
            n = int(grid.prod())
            key = pixels[start : start + n : 97].numpy().tobytes()  # identifies the image here
            start += n
            if cached and key in seen:
                continue
            seen.add(key)
            total += flops.image(n)
    return total


def bounds(
    hbm: HbmBound, flops: FlopModel, reqs: list[ModelRequest], new: int, cached: bool
) -> Figures:
    """tok/s if decode ran at the HBM bound (prefill free), and if the prefill also ran at
    the measured matmul rate (both in turn: the concurrent run's real ceiling)."""
    decode_s = new * len(reqs) / hbm.tok_s([len(r.input_ids) for r in reqs])
    tokens = new * len(reqs)
    prefill_s = prefill_flops(flops, reqs, cached) / flops.peak_flop_s
    return {
        "hbm_bound_tok_s": tokens / decode_s,
        "prefill_flops_t": prefill_flops(flops, reqs, cached) / 1e12,
        "prefill_at_peak_s": prefill_s,
        "prefill_plus_hbm_bound_tok_s": tokens / (decode_s + prefill_s),
    }


# ---------------------------------------------------------------------------- timers
@contextmanager
def timers(device: torch.device, into: dict[str, list[float]]) -> Iterator[None]:
    """Synchronised time of every prefill forward and every vision-encoder call."""
    with timed_methods(device, into, [(BatchDecoder, "prefill"), (CachedVisionForward, "_encode")]):
        yield


# ---------------------------------------------------------------------------- runs
def engine_for(model: Any, processor: Any, device: torch.device, **config: Any) -> InProcessEngine:
    engine = InProcessEngine(
        model, processor, config=InProcessEngineConfig(device=str(device), **config)
    )
    engine.initialize()
    return engine


def clear_cache(engine: InProcessEngine) -> None:
    if engine.vision_cache is not None:
        engine.vision_cache.clear()


def singles(
    cached: InProcessEngine,
    plain: InProcessEngine,
    turns: list[ModelRequest],
    hbm: HbmBound,
    big: int,
) -> Figures:
    out: Figures = {}
    # each turn of the largest batch alone, on the engine without the cache (the path as it
    # was: the goal's denominator) and with an emptied cache, alternating
    alone: dict[str, list[float]] = {"no_cache": [], "cache_cold": []}
    for k, req in enumerate(turns[4 : 4 + big]):
        order = [("no_cache", plain), ("cache_cold", cached)]
        for label, engine in order if k % 2 == 0 else reversed(order):
            clear_cache(engine)
            (resp,), _, _ = asyncio.run(generate(engine, [one_token(req)], concurrent=False))
            alone[label].append(resp.ttft)
    out["single_prefill_s"] = alone
    out["single_prefill_sum_s"] = sum(alone["no_cache"])
    out["single_prefill_sum_cache_cold_s"] = sum(alone["cache_cold"])
    # batch-1 time to first token, cache (cold) vs no cache, alternating, 4 rounds
    runs: dict[str, list[float]] = {"cache_cold": [], "no_cache": []}
    for k in range(4):
        for req in turns[1:4]:
            order = [("cache_cold", cached), ("no_cache", plain)]
            for label, engine in order if k % 2 == 0 else reversed(order):
                clear_cache(engine)
                (resp,), _, _ = asyncio.run(generate(engine, [one_token(req)], concurrent=False))
                runs[label].append(resp.ttft)
    out["ttft_batch1_ms"] = {k: 1000 * statistics.median(v) for k, v in runs.items()}
    # an episode: turns one after another, the cache kept (two of three images encoded)
    clear_cache(cached)
    episode = []
    for req in turns[0:6]:
        (resp,), _, _ = asyncio.run(generate(cached, [one_token(req)], concurrent=False))
        episode.append(resp.ttft)
    out["episode_ttft_ms"] = [1000 * t for t in episode]
    out["episode_ttft_warm_median_ms"] = 1000 * statistics.median(episode[2:])
    plain_episode = []
    for req in turns[0:6]:
        (resp,), _, _ = asyncio.run(generate(plain, [one_token(req)], concurrent=False))
        plain_episode.append(resp.ttft)
    out["episode_ttft_no_cache_ms"] = [1000 * t for t in plain_episode]
    out["episode_ttft_no_cache_median_ms"] = 1000 * statistics.median(plain_episode[2:])
    # batch-1 decode
    rates = []
    for req in turns[1:3]:
        (resp,), _, _ = asyncio.run(generate(cached, [req], concurrent=False))
        rates.append((len(resp.output_tokens) - 1) / (resp.latency - resp.ttft))
    bound_1 = statistics.median(hbm.tok_s([len(r.input_ids)]) for r in turns[1:3])
    out["decode_batch1_tok_s"] = statistics.median(rates)
    out["decode_batch1_bound_tok_s"] = bound_1
    out["decode_batch1_fraction"] = statistics.median(rates) / bound_1
    print(
        f"[single] sum of the {big} turns' prefills alone: {out['single_prefill_sum_s']:.2f} s "
        f"without the cache, {out['single_prefill_sum_cache_cold_s']:.2f} s with it emptied; "
        f"batch-1 ttft ms {out['ttft_batch1_ms']}; episode "
        f"ttft ms {[round(t) for t in out['episode_ttft_ms']]} (without the cache "
        f"{[round(t) for t in out['episode_ttft_no_cache_ms']]}); batch-1 decode "
        f"{out['decode_batch1_tok_s']:.1f} tok/s = {100 * out['decode_batch1_fraction']:.1f} % "
        f"of the HBM bound {bound_1:.0f}"
    )
    return out


def concurrent(
    engine: InProcessEngine,
    label: str,
    reqs: list[ModelRequest],
    hbm: HbmBound,
    flops: FlopModel,
    device: torch.device,
    new: int,
) -> Figures:
    clear_cache(engine)
    reset_peak(device)
    calls: dict[str, list[float]] = {}
    misses = 0 if engine.vision_cache is None else engine.vision_cache.misses
    try:
        with timers(device, calls):
            responses, wall, queued = asyncio.run(generate(engine, reqs, True))
    except RuntimeError as exc:
        print(f"[{label}] failed: {exc!r}"[:400])
        return {"error": repr(exc)[:400]}
    ttfts = sorted(r.ttft - queued for r in responses)
    tokens = sum(len(r.output_tokens) for r in responses)
    cache = engine.vision_cache
    figures: Figures = {
        "rows": len(reqs),
        "prompt_tokens": [len(r.input_ids) for r in reqs],
        "wall_s": wall,
        "tok_s": tokens / wall,
        "ttft_median_s": statistics.median(ttfts),
        "ttft_s": ttfts,
        "peak_gib": peak_gib(device),
        "prefill_calls": len(calls.get("prefill", [])),
        "prefill_total_s": sum(calls.get("prefill", [])),
        "vision_encode_s": sum(calls.get("_encode", [])),
        "vision_encoded_images": None if cache is None else cache.misses - misses,
        "vision_images_shown": sum(
            len(r.metadata["multi_modal_input"]["image_grid_thw"]) for r in reqs
        ),
        **bounds(hbm, flops, reqs, new, cached=cache is not None),
    }
    print(
        f"[{label}] {len(reqs)} rows: wall {wall:.2f} s, {figures['tok_s']:.1f} tok/s (HBM "
        f"bound {figures['hbm_bound_tok_s']:.0f}, prefill-at-peak + HBM bound "
        f"{figures['prefill_plus_hbm_bound_tok_s']:.0f}), median ttft "
        f"{figures['ttft_median_s']:.2f} s, prefill {figures['prefill_total_s']:.2f} s in "
        f"{figures['prefill_calls']} calls (vision {figures['vision_encode_s']:.2f} s, "
        f"{figures['vision_encoded_images']} of {figures['vision_images_shown']} images "
        "encoded), peak "
        f"{figures['peak_gib']} GiB"
    )
    return figures


def ratios(report: Figures, small: int, big: int) -> Figures:
    single = report["single"]
    out: Figures = {}
    for workload in ("episode", "distinct"):
        got = report.get(workload, {})
        c8, c32 = got.get(f"c{small}", {}), got.get(f"c{big}", {})
        if "tok_s" not in c8 or "tok_s" not in c32:
            continue
        out[workload] = {
            "ttft32_median_over_single_sum": c32["ttft_median_s"] / single["single_prefill_sum_s"],
            "ttft32_median_over_single_sum_cache_cold": c32["ttft_median_s"]
            / single["single_prefill_sum_cache_cold_s"],
            "goal_ttft": 0.3,
            "tok_s_32_over_8": c32["tok_s"] / c8["tok_s"],
            "goal_32_over_8": 2.5,
            "c32_fraction_of_hbm_bound": c32["tok_s"] / c32["hbm_bound_tok_s"],
            "c32_fraction_of_prefill_plus_hbm_bound": c32["tok_s"]
            / c32["prefill_plus_hbm_bound_tok_s"],
            "goal_fraction_of_hbm_bound": 0.5,
        }
        print(
            f"[ratios:{workload}] " + json.dumps({k: round(v, 3) for k, v in out[workload].items()})
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--real-layers", type=int, default=28)
    parser.add_argument("--real-vision-depth", type=int, default=24)
    parser.add_argument("--real-max-pixels", type=int, default=REAL_MAX_PIXELS)
    parser.add_argument("--workloads", default="episode,distinct")
    parser.add_argument("--concurrency", default="8,32", help="small,big")
    parser.add_argument("--pad", type=int, default=70, help="instruction repeats per turn")
    args = parser.parse_args()
    small, big = (int(x) for x in args.concurrency.split(","))
    device = torch.device(args.device)
    report: Figures = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
        report["gpu_total_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
    print(json.dumps(report))

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str))

    tokenizer = build_tokenizer()
    processor = build_processor(
        tokenizer, TinySpec(min_pixels=REAL_MIN_PIXELS, max_pixels=args.real_max_pixels)
    )
    model = real_size_model(tokenizer, device, args)
    config = default_prompt_config(
        "mai_ui", min_pixels=REAL_MIN_PIXELS, max_pixels=args.real_max_pixels
    )
    builder = PromptBuilder(config, processor, encode_images=False)
    build_s: list[float] = []
    phases: list[Figures] = []
    turns = asyncio.run(episode_turns(builder, 4 + big, args, build_s, phases))
    report["prompt_build"] = {
        "per_turn_ms_median": 1000 * statistics.median(build_s[3:]),
        "per_turn_ms": [1000 * s for s in build_s],
        "phases_ms_median": {
            k: 1000 * statistics.median(p.get(k, 0.0) for p in phases[3:]) for k in phases[-1]
        },
        "goal_ms": 50,
    }
    print(
        f"[prompt] {json.dumps(report['prompt_build']['phases_ms_median'])}, per turn "
        f"{report['prompt_build']['per_turn_ms_median']:.1f} ms (goal 50)"
    )
    hbm = HbmBound.measure(model, device, args.new_tokens)
    flops = FlopModel.measure(model, device)
    report["hbm"] = hbm.figures()
    report["peak_tflop_s"] = flops.peak_flop_s / 1e12
    print(f"[bounds] {hbm.describe()}; bf16 matmul {flops.peak_flop_s / 1e12:.0f} TFLOP/s")
    save()
    cached = engine_for(model, processor, device, max_batch_size=big)
    plain = engine_for(model, processor, device, max_batch_size=big, vision_cache_mb=0)
    try:
        for engine in (cached, plain):  # warm-up: compiles, graphs
            asyncio.run(generate(engine, [turns[0]], concurrent=False))
        report["single"] = singles(cached, plain, turns, hbm, big)
        save()
        report["episode_no_cache"] = {
            f"c{big}": concurrent(
                plain,
                f"episode:{big}:no-cache",
                turns[4 : 4 + big],
                hbm,
                flops,
                device,
                args.new_tokens,
            )
        }
        save()
        plain.destroy()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        workloads = args.workloads.split(",")
        if "distinct" in workloads:
            distinct = asyncio.run(distinct_turns(builder, range(4, 4 + big), args))
        for workload in workloads:
            reqs = turns[4 : 4 + big] if workload == "episode" else distinct
            report[workload] = {}
            for n in (small, big):
                report[workload][f"c{n}"] = concurrent(
                    cached, f"{workload}:{n}", reqs[:n], hbm, flops, device, args.new_tokens
                )
                save()
    finally:
        cached.destroy()
        plain.destroy()
    report["ratios"] = ratios(report, small, big)
    save()
    print(json.dumps(report["ratios"], indent=2))


if __name__ == "__main__":
    main()
