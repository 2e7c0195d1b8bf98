"""GPU check of the in-process engine and the embedded GRPO update, with figures.

Sections (``--sections``, all by default):

* ``exact``: the tiny Qwen3-VL (``build_tiny_qwen3_vl``). Sampled requests whose prompts come
  from the real ``PromptBuilder`` (MAI-UI, 1080x2400 screenshots, 1 to 3 images, so rows of
  different lengths share a left-padded batch) run concurrently through
  ``InProcessEngine.from_pretrained(dir, device=...)``; every returned log-prob is compared
  with ONE plain forward pass over prompt + output: fp32 with TF32 off, then bf16 (against a
  bf16 and the fp32 forward). Then tok/s, sequential vs concurrent.
* ``real``: a randomly initialised Qwen3-VL with 2B-like sizes (text 2048 x 28 layers, vocab
  151936; vision 1024 x 24 layers), built in bf16 on the device (no download), with Qwen3-VL's
  real pixel budget (a 1080x2400 screenshot becomes 1088x2400, 2550 image tokens). A
  3-screenshot MAI-UI prompt, 256 new tokens: prefill (time to first token), per-turn latency,
  decode tok/s, peak memory; then several turns decoded as one batch. Every turn has its own
  prompt length, as in real rollouts. The tokenizer is the tiny one (only the text part of the
  prompt is shorter than with Qwen's real vocabulary). Each decoder of ``--real-decoders``
  (default ``slots,legacy``: the old static-batching path stays measurable in the same run)
  is measured on the same turns: single turns with the decoders alternating on each
  prompt (which goes first alternates too), then a breakdown of one turn's time to first
  token (prefill forward, arena copy, first sampling, the rest); batch-1 decode is printed
  beside its HBM bound (text weights + the row's KV read once per step at the measured copy
  bandwidth), and the largest concurrency beside plain ``model.generate`` on the same inputs
  (``--real-generate dynamic,static``: default cache; static cache, which transformers
  compiles), as one batch or, where that runs out of memory, in batches of
  ``--real-generate-chunk`` rows one after another. ``--profile`` adds a torch.profiler
  table of one slots-decoder turn; ``--no-decode-compile`` keeps the slots decoder's
  graphs eager-kernel (no ``torch.compile`` of the elementwise work).
* ``grpo``: ``LocalTrainEngine`` + AReaL's ``PPOActor`` with the embedded default's actor
  config on the tiny model: groups sampled from the engine, then the phases of
  ``cua_native.training.embedded.trainer._ppo_step`` timed one by one (``compute_logp``, checked
  against the engine's log-probs; ``compute_advantages``; ``ppo_update``) and the new weights
  copied into the engine, whose next tokens carry the new version and match the trainer.

    python bench/gpu/gpu_check.py [--device cuda] [--sections exact,real,grpo] [--json out.json]
                              [--no-cudnn-sdp] [--real-concurrency 8,32]
                              [--real-decoders slots,legacy] [--real-generate dynamic,static]
                              [--real-generate-chunk 8] [--real-ttft-rounds 4]
                              [--no-decode-compile] [--profile]

``--no-cudnn-sdp``: PyTorch (2.11, H100/H200, bf16) picks cuDNN for scaled-dot-product
attention, and cuDNN builds a new execution plan for every new tensor shape. With a KV cache
every decode step has a new key length, so unless a shape was seen before each step pays the
plan build (measured on an H200: 40 ms instead of 16 ms per step for the 2B-sized model).
Compare the ``real`` figures with and without the flag.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest, ModelResponse
from PIL import Image, ImageDraw

from cua_native.actions.dialects import get_dialect
from cua_native.engine import InProcessEngine, InProcessEngineConfig
from cua_native.gym.protocol import Screenshot, Task
from cua_native.models.tiny import TinySpec, build_processor, build_tiny_qwen3_vl, build_tokenizer
from cua_native.prompts import HistoryStep, PromptBuilder, default_prompt_config
from cua_native.rollout.trajectory import VisionTokens

CLICK = (
    "<thinking>\nTap the Wi-Fi toggle\n</thinking>\n<tool_call>\n"
    '{"name":"mobile_use","arguments":{"action":"click","coordinate":[299,399]}}\n</tool_call>'
)
SCREEN = (1080, 2400)
INSTRUCTION = "Turn on Wi-Fi, then open Settings"
QUEUE_WAIT_S = 1.0
REAL_MIN_PIXELS = 65536
REAL_MAX_PIXELS = 16777216
Figures = dict[str, Any]
REAL_DECODERS = ("slots", "slots:flash", "slots:matmul", "legacy")


# ---------------------------------------------------------------------------- helpers
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(device: torch.device, into: dict[str, float], key: str) -> Iterator[None]:
    sync(device)
    start = time.perf_counter()
    yield
    sync(device)
    into[key] = time.perf_counter() - start


def peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def screenshot(seed: int) -> Image.Image:
    """A phone-sized screenshot with noise and a few bars, different for every seed."""
    image = Image.effect_noise(SCREEN, 30 + seed % 17).convert("RGB")
    draw = ImageDraw.Draw(image)
    for row in range(6):
        top = 200 + 330 * row + 13 * seed % 90
        shade = (40 * row + 31 * seed) % 255
        draw.rectangle((60, top, 1020, top + 180), fill=(shade, 255 - shade, 120))
    return image


async def build_prompts(
    processor: Any,
    n: int,
    gconfigs: Callable[[int], GenerationHyperparameters],
    instructions: Callable[[int], str] = lambda i: INSTRUCTION,
    **prompt_overrides: Any,
) -> list[ModelRequest]:
    """``n`` MAI-UI turns through ``PromptBuilder``: turn ``i`` shows ``min(i + 1, 3)``
    screenshots (MAI-UI's window), so the first three prompt lengths differ; after that they
    differ only where ``instructions(i)`` does."""
    config = default_prompt_config("mai_ui", **prompt_overrides)
    builder = PromptBuilder(config, processor, encode_images=False)
    dialect = get_dialect("mai_ui")
    history: list[HistoryStep] = []
    requests: list[ModelRequest] = []
    for i in range(n):
        task = Task(task_id="gpu-check", instruction=instructions(i))
        current = await builder.prepare_image(Screenshot(image=screenshot(i)))
        built = await builder.build(task, history[-2:], current, gconfigs(i))
        requests.append(built.request)
        history.append(HistoryStep(current, dialect.parse(CLICK), CLICK))
    return requests


def sampled(i: int, new_tokens: int, ignore_eos: bool = False) -> GenerationHyperparameters:
    """Sampling settings that vary across requests (plain, temperature, top-k, top-p)."""
    variants = [
        {"temperature": 1.0},
        {"temperature": 0.7},
        {"temperature": 1.0, "top_k": 50},
        {"temperature": 0.9, "top_p": 0.9},
    ]
    return GenerationHyperparameters(
        max_new_tokens=new_tokens, ignore_eos=ignore_eos, **variants[i % len(variants)]
    )


async def generate(
    engine: InProcessEngine, requests: list[ModelRequest], concurrent: bool
) -> tuple[list[ModelResponse], float, float]:
    """Run ``requests`` one after another or all at once; returns (responses, wall seconds,
    seconds the concurrent ones were held in the queue before the clock started).

    Concurrent requests are queued while admission is paused, then released together, so
    the engine prefills them as ONE batch (its batching is static: a request that arrives
    while a batch runs waits for that batch to finish, which would measure arrival order)."""
    if not concurrent:
        start = time.perf_counter()
        responses = [await engine.agenerate(r) for r in requests]
        return responses, time.perf_counter() - start, 0.0
    created = time.perf_counter()
    engine.pause()
    try:
        tasks = [asyncio.ensure_future(engine.agenerate(r)) for r in requests]
        await asyncio.sleep(QUEUE_WAIT_S)  # input preparation runs off-loop; ms per request
    finally:
        engine.resume()
    start = time.perf_counter()
    responses = list(await asyncio.gather(*tasks))
    return responses, time.perf_counter() - start, start - created


@torch.no_grad()
def reference_logprobs(
    model: Any, req: ModelRequest, output: list[int], temperature: float
) -> torch.Tensor:
    """ONE plain forward over prompt + output: ``log_softmax(logits / T)`` of each output token."""
    device = next(model.parameters()).device
    full = torch.tensor([list(req.input_ids) + list(output)], device=device)
    mm = req.metadata["multi_modal_input"]
    types = torch.zeros_like(full)
    types[full == model.config.image_token_id] = 1
    model.model.rope_deltas = None  # the model caches this between calls
    logits = model(
        input_ids=full,
        pixel_values=mm["pixel_values"].to(device, model.dtype),
        image_grid_thw=mm["image_grid_thw"].to(device),
        mm_token_type_ids=types,
    ).logits[0]
    t = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits.float() / t, dim=-1)
    n = len(req.input_ids)
    positions = torch.arange(n - 1, n - 1 + len(output), device=device)
    return logprobs[positions, torch.tensor(output, device=device)].cpu()


def max_logprob_diff(
    model: Any, requests: list[ModelRequest], responses: list[ModelResponse]
) -> tuple[float, int]:
    worst, tokens = 0.0, 0
    for req, resp in zip(requests, responses, strict=True):
        ref = reference_logprobs(model, req, resp.output_tokens, req.gconfig.temperature)
        got = torch.tensor(resp.output_logprobs, dtype=torch.float32)
        worst = max(worst, float((got - ref).abs().max()))
        tokens += len(resp.output_tokens)
    return worst, tokens


def tok_per_s(responses: list[ModelResponse], wall: float) -> float:
    return sum(len(r.output_tokens) for r in responses) / wall


# ---------------------------------------------------------------------------- exact
def check_exact(device: torch.device, tiny_dir: Path, args: argparse.Namespace) -> Figures:
    from transformers import AutoModelForImageTextToText

    figures: Figures = {}
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        engine = InProcessEngine.from_pretrained(
            tiny_dir, device=str(device), dtype=dtype, max_batch_size=args.tiny_requests
        )
        try:
            requests = asyncio.run(
                build_prompts(
                    engine.processor,
                    args.tiny_requests,
                    lambda i: sampled(i, args.tiny_new_tokens),
                )
            )
            responses, _, _ = asyncio.run(generate(engine, requests, concurrent=True))
            reference = engine.model if dtype == torch.float32 else None
            if reference is None:
                reference = (
                    AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=dtype)
                    .to(device)
                    .eval()
                )
            worst, tokens = max_logprob_diff(reference, requests, responses)
            figures[f"{label}_max_abs_dlogprob"] = worst
            figures[f"{label}_tokens_checked"] = tokens
            figures[f"{label}_prompt_lengths"] = sorted({len(r.input_ids) for r in requests})
            print(f"[exact] {label}: max |dlogprob| {worst:.3g} over {tokens} sampled tokens")
            if dtype == torch.bfloat16:
                fp32 = (
                    AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32)
                    .to(device)
                    .eval()
                )
                worst32, _ = max_logprob_diff(fp32, requests, responses)
                figures["bf16_vs_fp32_max_abs_dlogprob"] = worst32
                print(f"[exact] bf16 engine vs fp32 forward: max |dlogprob| {worst32:.3g}")
                del fp32
            figures.update(throughput(engine, label, args))
        finally:
            engine.destroy()
    return figures


def throughput(engine: InProcessEngine, label: str, args: argparse.Namespace) -> Figures:
    """Sequential vs concurrent, each measured twice (interleaved); the better run counts."""
    n = args.tiny_requests
    requests = asyncio.run(
        build_prompts(engine.processor, n, lambda i: sampled(i, args.tiny_new_tokens, True))
    )
    asyncio.run(generate(engine, requests[:2], concurrent=True))  # warm-up
    modes = (("sequential", False), (f"{n}_concurrent", True))
    rates: dict[str, list[float]] = {mode: [] for mode, _ in modes}
    for _ in range(2):
        for mode, concurrent in modes:
            responses, wall, _ = asyncio.run(generate(engine, requests, concurrent))
            rates[mode].append(tok_per_s(responses, wall))
    figures: Figures = {}
    for mode, values in rates.items():
        figures[f"{label}_tok_s_{mode}"] = max(values)
        runs = ", ".join(f"{v:.1f}" for v in values)
        print(
            f"[exact] {label} {mode:>13}: {max(values):8.1f} tok/s (runs: {runs}), "
            f"{args.tiny_new_tokens} new tokens each"
        )
    return figures


# ---------------------------------------------------------------------------- real
def real_size_model(tokenizer: Any, device: torch.device, args: argparse.Namespace) -> Any:
    """Random Qwen3-VL with 2B-like dimensions, initialised directly on ``device`` in bf16."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {
        tok: tokenizer.convert_tokens_to_ids(tok)
        for tok in ("<|endoftext|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>")
    }
    depth = args.real_vision_depth
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": args.real_layers,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 262144,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": depth,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_heads": 16,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 2048,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [depth // 4 - 1, depth // 2 - 1, 3 * depth // 4 - 1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen3VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return model.eval()


def check_real(device: torch.device, args: argparse.Namespace) -> Figures:
    tokenizer = build_tokenizer()
    spec = TinySpec(min_pixels=REAL_MIN_PIXELS, max_pixels=args.real_max_pixels)
    processor = build_processor(tokenizer, spec)
    reset_peak(device)
    times: dict[str, float] = {}
    with timed(device, times, "build"):
        model = real_size_model(tokenizer, device, args)
    params = sum(p.numel() for p in model.parameters())
    weights_gib = peak_gib(device)
    figures: Figures = {"params_b": params / 1e9, "build_s": times["build"]}
    if weights_gib is not None:
        figures["weights_gib"] = weights_gib
    print(
        f"[real] {params / 1e9:.2f} B parameters in bf16, built on {device} in "
        f"{times['build']:.1f} s" + (f", {weights_gib:.2f} GiB" if weights_gib else "")
    )
    prompts_start = time.perf_counter()
    requests = asyncio.run(
        build_prompts(
            processor,
            2 + 4 + max(args.real_concurrency),
            lambda i: GenerationHyperparameters(
                max_new_tokens=args.real_new_tokens, ignore_eos=True, temperature=1.0
            ),
            # every turn ~280 tokens longer than the last: no turn's decode (256 new
            # tokens) revisits a (batch, length) shape an earlier one ran with, as in real
            # rollouts, where prompt lengths vary
            lambda i: INSTRUCTION + " Then go back." * (70 * i),
            min_pixels=REAL_MIN_PIXELS,
            max_pixels=args.real_max_pixels,
        )
    )
    figures["prompt_build_s_per_turn"] = (time.perf_counter() - prompts_start) / len(requests)
    turns = requests[2:]  # 3 screenshots each (MAI-UI window)
    grid = turns[0].metadata["multi_modal_input"]["image_grid_thw"]
    image_tokens = int(grid.prod(-1).sum()) // 4
    lengths = [len(t.input_ids) for t in turns]
    figures.update(prompt_tokens=lengths[0], image_tokens=image_tokens)
    print(
        f"[real] prompts: {min(lengths)}..{max(lengths)} tokens, {grid.shape[0]} images "
        f"({image_tokens} image tokens, grids {grid.tolist()}), "
        f"{args.real_new_tokens} new tokens"
    )
    bound = HbmBound.measure(model, device, args.real_new_tokens)
    figures["hbm"] = bound.figures()
    print(f"[real] {bound.describe()}")
    engines = {d: real_engine(model, processor, d, device, args) for d in args.real_decoders}
    try:
        for engine in engines.values():  # warm-up: compiles, first graphs, first shapes
            asyncio.run(generate(engine, [turns[0]], concurrent=False))
        for decoder, single in single_turns(engines, turns[1:4], bound, device).items():
            figures[decoder] = single
        for decoder, engine in list(engines.items()):
            figures[decoder]["first_token"] = first_token_parts(engine, decoder, turns[1], device)
        for decoder, ttft in ttft_probe(engines, turns[1:4], args.real_ttft_rounds).items():
            figures[decoder].update(ttft)
        for decoder, engine in list(engines.items()):
            figures[decoder].update(concurrent_turns(engine, decoder, turns, bound, device, args))
            if args.profile and decoder.startswith("slots"):
                figures[decoder]["profile"] = profile_decode(engine, turns[1], device, args)
            engines.pop(decoder).destroy()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        for engine in engines.values():
            engine.destroy()
    for mode in args.real_generate:
        figures[f"generate_{mode}"] = generate_baseline(model, turns, mode, device, args)
    print_ratios(figures, args)
    return figures


def real_engine(
    model: Any, processor: Any, decoder: str, device: torch.device, args: argparse.Namespace
) -> InProcessEngine:
    kind, _, attention = decoder.partition(":")
    config = InProcessEngineConfig(
        device=str(device),
        max_batch_size=max(args.real_concurrency),
        decoder=kind,  # type: ignore[arg-type]
        decode_attention=attention or "auto",  # type: ignore[arg-type]
        decode_compile=not args.no_decode_compile,
    )
    engine = InProcessEngine(model, processor, config=config)
    engine.initialize()
    return engine


def single_turns(
    engines: dict[str, InProcessEngine],
    singles: list[ModelRequest],
    bound: HbmBound,
    device: torch.device,
) -> dict[str, Figures]:
    """One turn at a time (ttft, decode rate against the HBM bound), the decoders taking
    turns on each prompt and alternating which goes first, so neither profits from shapes
    (kernel plans, allocator blocks) the other just ran."""
    latencies: dict[str, list[float]] = {d: [] for d in engines}
    ttfts: dict[str, list[float]] = {d: [] for d in engines}
    rates: dict[str, list[float]] = {d: [] for d in engines}
    peaks: dict[str, float | None] = {}
    for k, req in enumerate(singles):
        order = list(engines) if k % 2 == 0 else list(reversed(engines))
        for decoder in order:
            reset_peak(device)
            (resp,), _, _ = asyncio.run(generate(engines[decoder], [req], concurrent=False))
            peaks[decoder] = max(peaks.get(decoder) or 0.0, peak_gib(device) or 0.0) or None
            latencies[decoder].append(resp.latency)
            ttfts[decoder].append(resp.ttft)
            rates[decoder].append((len(resp.output_tokens) - 1) / (resp.latency - resp.ttft))
    bound_1 = statistics.median(bound.tok_s([len(r.input_ids)]) for r in singles)
    out: dict[str, Figures] = {}
    for label in engines:
        figures: Figures = {
            "decoder": label,
            "turn_latency_s": statistics.median(latencies[label]),
            "prefill_s": statistics.median(ttfts[label]),
            "prefill_runs_s": ttfts[label],
            "decode_tok_s": statistics.median(rates[label]),
            "decode_bound_tok_s": bound_1,
            "decode_fraction_of_bound": statistics.median(rates[label]) / bound_1,
            "peak_gib_single": peaks.get(label),
        }
        out[label] = figures
        print(
            f"[real:{label}] 1 turn: latency {figures['turn_latency_s']:.2f} s, prefill (ttft) "
            f"{figures['prefill_s'] * 1000:.0f} ms (runs "
            + ", ".join(f"{t * 1000:.0f}" for t in ttfts[label])
            + f"), decode {figures['decode_tok_s']:.1f} tok/s "
            f"= {100 * figures['decode_fraction_of_bound']:.1f} % of the HBM bound "
            f"{bound_1:.0f} tok/s"
            + (f", peak {figures['peak_gib_single']:.2f} GiB" if figures["peak_gib_single"] else "")
        )
    return out


def ttft_probe(
    engines: dict[str, InProcessEngine], singles: list[ModelRequest], rounds: int
) -> dict[str, Figures]:
    """Time to first token alone: the single turns with ``max_new_tokens=1``, ``rounds``
    times, the decoders alternating on each prompt (and which goes first), so a median
    over many runs compares them (one prefill varies by ~+-10 % run to run)."""
    runs: dict[str, list[float]] = {d: [] for d in engines}
    k = 0
    for _ in range(rounds):
        for req in singles:
            one = dataclasses.replace(
                req, gconfig=dataclasses.replace(req.gconfig, max_new_tokens=1)
            )
            order = list(engines) if k % 2 == 0 else list(reversed(engines))
            k += 1
            for decoder in order:
                (resp,), _, _ = asyncio.run(generate(engines[decoder], [one], concurrent=False))
                runs[decoder].append(resp.ttft)
    out: dict[str, Figures] = {}
    for decoder, values in runs.items():
        out[decoder] = {"ttft_probe_s": statistics.median(values), "ttft_probe_runs": len(values)}
        print(
            f"[real:{decoder}] time to first token alone: median "
            f"{statistics.median(values) * 1000:.0f} ms over {len(values)} runs "
            f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"
        )
    return out


@contextmanager
def timed_methods(
    device: torch.device, into: dict[str, list[float]], targets: list[tuple[Any, str]]
) -> Iterator[None]:
    """Time (device-synchronised) every call of each ``(class, method)`` in ``targets`` into
    ``into[method]``; the methods are restored on exit."""
    originals = [(cls, name, getattr(cls, name)) for cls, name in targets]

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*a: Any, **k: Any) -> Any:
            sync(device)
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                sync(device)
                into.setdefault(name, []).append(time.perf_counter() - start)

        return timed_call

    for cls, name, fn in originals:
        setattr(cls, name, wrap(name, fn))
    try:
        yield
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)


@contextmanager
def method_timers(device: torch.device, into: dict[str, list[float]]) -> Iterator[None]:
    """Time (device-synchronised) every call of the first-token path's parts."""
    from cua_native.engine.batch import BatchDecoder
    from cua_native.engine.slots import SlotDecoder

    targets = [(BatchDecoder, "prefill"), (SlotDecoder, "fill"), (InProcessEngine, "_sample")]
    with timed_methods(device, into, targets):
        yield


def first_token_parts(
    engine: InProcessEngine, label: str, req: ModelRequest, device: torch.device
) -> Figures:
    """Where one turn's time to first token goes: the prefill forward, the rest of the
    slots decoder's ``fill`` (copies into the arena), the first sampling, and the remainder
    (queue, input preparation, worker wake-up)."""
    calls: dict[str, list[float]] = {}
    with method_timers(device, calls):
        (resp,), _, _ = asyncio.run(generate(engine, [req], concurrent=False))
    prefill = calls["prefill"][0]
    fill_extra = calls["fill"][0] - prefill if "fill" in calls else 0.0
    sample = calls["_sample"][0]
    parts = {
        "ttft_ms": resp.ttft * 1000,
        "prefill_forward_ms": prefill * 1000,
        "arena_copy_ms": fill_extra * 1000,
        "first_sample_ms": sample * 1000,
        "other_ms": (resp.ttft - prefill - fill_extra - sample) * 1000,
    }
    print(
        f"[real:{label}] first token (synchronised timers): "
        + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
    )
    return parts


def concurrent_turns(
    engine: InProcessEngine,
    label: str,
    turns: list[ModelRequest],
    bound: HbmBound,
    device: torch.device,
    args: argparse.Namespace,
) -> Figures:
    """``n`` turns released together for each ``--real-concurrency`` n."""
    figures: Figures = {}
    for n in args.real_concurrency:
        reset_peak(device)
        batch = turns[4 : 4 + n]
        try:
            responses, wall, queued = asyncio.run(generate(engine, batch, True))
        except RuntimeError as exc:  # an out-of-memory surfaces as "generation failed"
            figures[f"concurrent_{n}_error"] = repr(exc)[:300]
            print(f"[real:{label}] {n} concurrent turns failed: {exc!r}"[:400])
            break
        bound_n = bound.tok_s([len(r.input_ids) for r in batch])
        figures[f"concurrent_{n}_wall_s"] = wall
        figures[f"concurrent_{n}_tok_s"] = tok_per_s(responses, wall)
        figures[f"concurrent_{n}_bound_tok_s"] = bound_n
        figures[f"concurrent_{n}_ttft_s"] = statistics.median(r.ttft - queued for r in responses)
        figures[f"concurrent_{n}_peak_gib"] = peak_gib(device)
        print(
            f"[real:{label}] {n} concurrent turns: wall {wall:.2f} s, "
            f"{figures[f'concurrent_{n}_tok_s']:.1f} tok/s total (HBM bound {bound_n:.0f}), "
            f"median ttft {figures[f'concurrent_{n}_ttft_s'] * 1000:.0f} ms"
            + (
                f", peak {figures[f'concurrent_{n}_peak_gib']:.2f} GiB"
                if device.type == "cuda"
                else ""
            )
        )
    return figures


def copy_bandwidth(device: torch.device, repeats: int = 20) -> float:
    """Bytes/s of device-to-device copies of 1 GiB (read + write counted), after a warm-up."""
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    stop.record()
    stop.synchronize()
    return float(2 * repeats * src.numel() / (start.elapsed_time(stop) / 1000))


class HbmBound:
    """Decode tok/s if every step only read the text weights and the rows' KV once, at the
    device-to-device copy bandwidth measured here (bytes read + written)."""

    def __init__(self, bandwidth: float, weight_bytes: int, kv_bytes_per_token: int, new: int):
        self.bandwidth = bandwidth
        self.weight_bytes = weight_bytes
        self.kv_bytes_per_token = kv_bytes_per_token
        self.new_tokens = new

    @classmethod
    def measure(cls, model: Any, device: torch.device, new_tokens: int) -> HbmBound:
        text = model.model.language_model
        seen: set[int] = set()
        weight_bytes = 0
        for p in [*text.parameters(), *model.get_output_embeddings().parameters()]:
            if id(p) not in seen:  # tied input/output embeddings are read once (the head)
                seen.add(id(p))
                weight_bytes += p.numel() * p.element_size()
        cfg = text.config
        kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
        bandwidth = copy_bandwidth(device) if device.type == "cuda" else float("nan")
        return cls(bandwidth, weight_bytes, kv_per_token, new_tokens)

    def tok_s(self, prompt_lengths: list[int]) -> float:
        """Bound for rows decoding together (mean context: prompt + half the new tokens)."""
        kv = sum(n + self.new_tokens // 2 for n in prompt_lengths) * self.kv_bytes_per_token
        return len(prompt_lengths) * self.bandwidth / (self.weight_bytes + kv)

    def figures(self) -> Figures:
        return {
            "bandwidth_tb_s": self.bandwidth / 1e12,
            "text_weight_gb": self.weight_bytes / 1e9,
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }

    def describe(self) -> str:
        return (
            f"HBM bound inputs: copy bandwidth {self.bandwidth / 1e12:.2f} TB/s, text weights "
            f"{self.weight_bytes / 1e9:.2f} GB, KV {self.kv_bytes_per_token / 1e3:.1f} kB/token"
        )


def profile_decode(
    engine: InProcessEngine, req: ModelRequest, device: torch.device, args: argparse.Namespace
) -> Figures:
    """torch.profiler over one turn: where the decode steps' GPU and CPU time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        (resp,), _, _ = asyncio.run(generate(engine, [req], concurrent=False))
    events = prof.key_averages()
    table = events.table(
        sort_by="self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total",
        row_limit=18,
    )
    print(table)
    gpu_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
    steps = len(resp.output_tokens)
    figures = {
        "tokens": steps,
        "wall_s": resp.latency,
        "ttft_s": resp.ttft,
        "gpu_ms_total": gpu_us / 1000,
        "kernels_total": kernels,
        "table": table,
    }
    print(
        f"[profile] one turn of {steps} tokens: {resp.latency:.2f} s wall, GPU busy "
        f"{gpu_us / 1000:.0f} ms, {kernels} kernels (prefill included)"
    )
    return figures


def generate_baseline(
    model: Any,
    turns: list[ModelRequest],
    mode: str,
    device: torch.device,
    args: argparse.Namespace,
) -> Figures:
    """Plain ``model.generate`` on the same (``--real-concurrency`` max) turns the engine
    decoded together: ``dynamic`` (default cache) or ``static`` (static cache, which
    transformers compiles). First as one left-padded batch; where that fails (out of
    memory), in consecutive chunks of ``--real-generate-chunk`` rows, one after another
    (total new tokens over total wall), so the ratio has a denominator on the same inputs.
    The first chunk's rows are the ``--real-concurrency`` turns of its size, so its rate
    is also plain ``generate`` at that concurrency."""
    n = max(args.real_concurrency)
    batch = turns[4 : 4 + n]
    figures: Figures = {"rows": n}
    whole = _generate_rows(model, batch, mode, device, args)
    if "error" not in whole or args.real_generate_chunk >= n:
        figures.update(whole)
        if "tok_s" in whole:
            print(
                f"[generate:{mode}] {n} turns as one batch: wall {whole['wall_s']:.2f} s, "
                f"{whole['tok_s']:.1f} tok/s"
            )
        return figures
    figures["one_batch_error"] = whole["error"]
    size = args.real_generate_chunk
    chunks = [
        _generate_rows(model, batch[i : i + size], mode, device, args) for i in range(0, n, size)
    ]
    failed = [c["error"] for c in chunks if "error" in c]
    if failed:
        figures["error"] = failed[0]
        return figures
    wall = sum(c["wall_s"] for c in chunks)
    tokens = sum(c["new_tokens"] for c in chunks)
    figures.update(
        chunk_rows=size,
        wall_s=wall,
        tok_s=tokens / wall,
        chunk_tok_s=[c["tok_s"] for c in chunks],
        peak_gib=max((c.get("peak_gib") or 0.0) for c in chunks) or None,
    )
    print(
        f"[generate:{mode}] {n} turns as one batch: out of memory; in {len(chunks)} batches "
        f"of {size} one after another: wall {wall:.2f} s, {tokens / wall:.1f} tok/s (per "
        "batch " + ", ".join(f"{c['tok_s']:.1f}" for c in chunks) + " tok/s)"
    )
    return figures


def _generate_rows(
    model: Any,
    batch: list[ModelRequest],
    mode: str,
    device: torch.device,
    args: argparse.Namespace,
) -> Figures:
    """One ``model.generate`` call over ``batch`` as a left-padded batch."""
    n = len(batch)
    pad = model.generation_config.pad_token_id
    width = max(len(r.input_ids) for r in batch)
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(batch):
        ids[i, width - len(r.input_ids) :] = torch.tensor(r.input_ids)
        mask[i, width - len(r.input_ids) :] = 1
    mm = [r.metadata["multi_modal_input"] for r in batch]
    types = (ids == model.config.image_token_id).long()
    inputs = {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "mm_token_type_ids": types.to(device),
        "pixel_values": torch.cat([m["pixel_values"] for m in mm]).to(device, model.dtype),
        "image_grid_thw": torch.cat([m["image_grid_thw"] for m in mm]).to(device),
    }
    kwargs: dict[str, Any] = {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_new_tokens": args.real_new_tokens,
        "max_new_tokens": args.real_new_tokens,
    }
    if mode == "static":
        kwargs["cache_implementation"] = "static"
    figures: Figures = {"rows": n}
    try:
        with torch.inference_mode():
            model.model.rope_deltas = None
            if mode == "static":  # the first call compiles; not timed
                start = time.perf_counter()
                model.generate(**inputs, **{**kwargs, "min_new_tokens": 4, "max_new_tokens": 4})
                figures["compile_s"] = time.perf_counter() - start
            reset_peak(device)
            model.model.rope_deltas = None
            sync(device)
            start = time.perf_counter()
            out = model.generate(**inputs, **kwargs)
            sync(device)
            wall = time.perf_counter() - start
    except Exception as exc:  # an out-of-memory or a compile failure is a figure too
        figures["error"] = repr(exc)[:300]
        print(f"[generate:{mode}] {n} rows failed: {exc!r}"[:400])
        return figures
    finally:
        inputs.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    new = (out.shape[1] - width) * n
    figures.update(wall_s=wall, new_tokens=new, tok_s=new / wall, peak_gib=peak_gib(device))
    return figures


def print_ratios(figures: Figures, args: argparse.Namespace) -> None:
    """The goals' ratios, side by side: new decoder against the legacy one and generate."""
    n = max(args.real_concurrency)
    labels = [d for d in args.real_decoders if d in figures]
    base = figures.get("generate_dynamic", {}).get("tok_s")
    for label in labels:
        got = figures[label]
        line = (
            f"[ratios:{label}] batch-1 decode {got['decode_tok_s']:.1f} tok/s = "
            f"{100 * got['decode_fraction_of_bound']:.1f} % of HBM bound "
            f"{got['decode_bound_tok_s']:.0f}; ttft {got['prefill_s'] * 1000:.0f} ms"
        )
        if "ttft_probe_s" in got:
            line += f" (1-token probe: {got['ttft_probe_s'] * 1000:.0f} ms)"
        rate = got.get(f"concurrent_{n}_tok_s")
        dynamic = figures.get("generate_dynamic", {})
        if rate is not None and base:
            line += f"; {n} concurrent {rate:.1f} tok/s = x{rate / base:.2f} plain generate"
            if "chunk_rows" in dynamic:
                line += f" (generate: one batch of {n} out of memory, run as batches of "
                line += f"{dynamic['chunk_rows']})"
        small = dynamic.get("chunk_rows")
        small_rate = got.get(f"concurrent_{small}_tok_s")
        if small_rate is not None and dynamic.get("chunk_tok_s"):
            first = dynamic["chunk_tok_s"][0]
            line += f"; {small} concurrent x{small_rate / first:.2f} plain generate ({first:.1f})"
        static = figures.get("generate_static", {}).get("tok_s")
        if rate is not None and static:
            line += f", x{rate / static:.2f} generate+static cache+compile"
        print(line)
    if "legacy" in figures:
        old = figures["legacy"]
        for label in labels:
            if label == "legacy":
                continue
            new = figures[label]
            probe = (
                f" (1-token probe x{new['ttft_probe_s'] / old['ttft_probe_s']:.2f})"
                if "ttft_probe_s" in new and "ttft_probe_s" in old
                else ""
            )
            print(
                f"[ratios:{label}/legacy] ttft x{new['prefill_s'] / old['prefill_s']:.2f}{probe}, "
                f"batch-1 decode x{new['decode_tok_s'] / old['decode_tok_s']:.2f}"
                + (
                    f", {n} concurrent x"
                    f"{new[f'concurrent_{n}_tok_s'] / old[f'concurrent_{n}_tok_s']:.2f}"
                    if f"concurrent_{n}_tok_s" in new and f"concurrent_{n}_tok_s" in old
                    else ""
                )
            )


# ---------------------------------------------------------------------------- grpo
def check_grpo(device: torch.device, tiny_dir: Path, args: argparse.Namespace) -> Figures:
    from areal.trainer.ppo.actor import PPOActor
    from areal.utils import stats_tracker
    from transformers import AutoModelForImageTextToText

    from cua_native.config import load_config
    from cua_native.training.local_engine import LocalTrainEngine

    actor_config = load_config(None, []).areal.actor
    engine = InProcessEngine.from_pretrained(tiny_dir, device=str(device), seed=1)
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir, dtype=torch.float32)
    trainer = LocalTrainEngine(
        model,
        lr=actor_config.optimizer.lr,
        weight_decay=actor_config.optimizer.weight_decay,
        grad_clip=actor_config.optimizer.gradient_clipping,
        temperature=actor_config.temperature,
        device=device,
        processor=engine.processor,
    )
    actor = PPOActor(actor_config, trainer)
    tokens = VisionTokens.from_tokenizer(engine.tokenizer)
    figures: Figures = {"temperature": actor_config.temperature}
    try:
        for step in range(args.grpo_steps):
            batch = asyncio.run(rollout_groups(engine, tokens, actor_config.temperature, args))
            # the engine's log-probs (position t: token t) and output masks, before AReaL
            # replaces ``logprobs`` with the recomputed ones
            sampled_logp = [(t["logprobs"].clone(), t["loss_mask"].clone()) for t in batch]
            times: dict[str, float] = {}
            with timed(device, times, "step"):
                with timed(device, times, "compute_logp"):
                    for traj, logp in zip(batch, actor.compute_logp(batch), strict=True):
                        traj["prox_logp"] = logp
                gap = max(  # recomputed position t holds token t + 1
                    float(
                        (traj["prox_logp"].cpu() - torch.roll(logp, -1, -1))[
                            torch.roll(mask, -1, -1).bool()
                        ]
                        .abs()
                        .max()
                    )
                    for traj, (logp, mask) in zip(batch, sampled_logp, strict=True)
                )
                with timed(device, times, "compute_advantages"):
                    advantages = actor.compute_advantages(batch)
                with timed(device, times, "ppo_update"):
                    actor.ppo_update(advantages)
                trainer.lr_scheduler_step()
            stats = stats_tracker.export_all()
            version = step + 1
            trainer.set_version(version)
            with timed(device, times, "weights_to_engine"):
                engine.update_weights_from_state_dict(trainer.state_dict(), version).result()
            rows = sum(int(t["input_ids"].shape[0]) for t in batch)
            loss = next((v for k, v in stats.items() if k.endswith("actor_loss/avg")), None)
            grad = next((v for k, v in stats.items() if k.endswith("grad_norm")), None)
            figures[f"step{step}"] = {
                **{k: round(v, 4) for k, v in times.items()},
                "rows": rows,
                "trainer_vs_engine_max_abs_dlogprob": gap,
                "loss": loss,
                "grad_norm": grad,
            }
            print(
                f"[grpo] step {step}: {rows} rows, step {times['step']:.3f} s (compute_logp "
                f"{times['compute_logp']:.3f}, advantages {times['compute_advantages']:.3f}, "
                f"ppo_update {times['ppo_update']:.3f}), weights->engine "
                f"{times['weights_to_engine'] * 1000:.0f} ms; trainer vs engine max "
                f"|dlogprob| {gap:.3g}; loss {loss}, grad_norm {grad}"
            )
        figures.update(after_update_check(engine, trainer, args))
    finally:
        engine.destroy()
    return figures


async def rollout_groups(
    engine: InProcessEngine, tokens: VisionTokens, temperature: float, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """``grpo_groups`` groups of ``group_size`` turns sampled at the trainer's temperature (as
    the workflow does), as AReaL rows (the layout of ``cua_native.rollout.trajectory.turn_sample``).
    Rewards are synthetic (alternating 1 and 0, then group-normalised): the check is about
    the update's mechanics, not learning."""
    from areal.utils.data import concat_padded_tensors

    from cua_native.rollout.trajectory import normalized_rewards

    batch: list[dict[str, Any]] = []
    for group in range(args.grpo_groups):
        prompts = await build_prompts(
            engine.processor,
            group + 1,
            lambda i: GenerationHyperparameters(
                max_new_tokens=args.tiny_new_tokens, temperature=temperature
            ),
        )
        prompt = prompts[-1]
        responses = await asyncio.gather(
            *(engine.agenerate(prompt) for _ in range(args.group_size))
        )
        rewards = normalized_rewards([float(i % 2 == 0) for i in range(args.group_size)], 1e-6)
        rows = [
            turn_row(prompt, resp, reward, tokens)
            for resp, reward in zip(responses, rewards, strict=True)
        ]
        batch.append(concat_padded_tensors(rows))
    return batch


def turn_row(
    req: ModelRequest, resp: ModelResponse, reward: float, tokens: VisionTokens
) -> dict[str, Any]:
    prompt, output = list(resp.input_tokens), list(resp.output_tokens)
    seq = prompt + output
    mm = req.metadata["multi_modal_input"]
    return {
        "input_ids": torch.tensor([seq], dtype=torch.long),
        "mm_token_type_ids": torch.tensor(
            [[1 if t == tokens.image_pad else 0 for t in prompt] + [0] * len(output)],
            dtype=torch.long,
        ),
        "loss_mask": torch.tensor([[0] * len(prompt) + [1] * len(output)], dtype=torch.int32),
        "logprobs": torch.tensor(
            [[0.0] * len(prompt) + list(resp.output_logprobs)], dtype=torch.float32
        ),
        "versions": torch.tensor(
            [[-1] * len(prompt) + list(resp.output_versions)], dtype=torch.int32
        ),
        "attention_mask": torch.ones((1, len(seq)), dtype=torch.bool),
        "rewards": torch.tensor([reward], dtype=torch.float32),
        "multi_modal_input": [
            {"pixel_values": mm["pixel_values"], "image_grid_thw": mm["image_grid_thw"]}
        ],
    }


def after_update_check(engine: InProcessEngine, trainer: Any, args: argparse.Namespace) -> Figures:
    """Tokens sampled after the update carry the new version and match the trainer's model."""
    requests = asyncio.run(
        build_prompts(engine.processor, 4, lambda i: sampled(i, args.tiny_new_tokens))
    )
    responses, _, _ = asyncio.run(generate(engine, requests, concurrent=True))
    versions = sorted({v for r in responses for v in r.output_versions})
    trainer.model.eval()
    worst, count = max_logprob_diff(trainer.model, requests, responses)
    print(
        f"[grpo] after update: versions {versions}, engine vs trained model max |dlogprob| "
        f"{worst:.3g} over {count} tokens"
    )
    return {"versions_after_update": versions, "after_update_max_abs_dlogprob": worst}


# ---------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sections", default="exact,real,grpo")
    parser.add_argument("--json", type=Path, help="write all figures here")
    parser.add_argument("--tiny-requests", type=int, default=8)
    parser.add_argument("--tiny-new-tokens", type=int, default=64)
    parser.add_argument("--real-new-tokens", type=int, default=256)
    parser.add_argument("--real-layers", type=int, default=28)
    parser.add_argument("--real-vision-depth", type=int, default=24)
    parser.add_argument("--real-max-pixels", type=int, default=REAL_MAX_PIXELS)
    parser.add_argument(
        "--real-concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[4, 8],
        help="numbers of turns decoded together (comma-separated)",
    )
    parser.add_argument(
        "--real-decoders",
        type=lambda s: [x for x in s.split(",") if x],
        default=["slots", "legacy"],
        help="engine decoders to measure, comma-separated: slots[:flash|:matmul], legacy",
    )
    parser.add_argument(
        "--real-generate",
        type=lambda s: [x for x in s.split(",") if x],
        default=["dynamic"],
        help="plain model.generate baselines on the largest concurrency: dynamic, static",
    )
    parser.add_argument(
        "--real-generate-chunk",
        type=int,
        default=8,
        help="rows per generate call when the largest concurrency fails as one batch",
    )
    parser.add_argument(
        "--real-ttft-rounds",
        type=int,
        default=4,
        help="rounds of the 1-token time-to-first-token probe over the 3 single turns",
    )
    parser.add_argument(
        "--no-decode-compile",
        action="store_true",
        help="slots decoder: CUDA graphs without torch.compile of the elementwise work",
    )
    parser.add_argument(
        "--profile", action="store_true", help="torch.profiler over one slots-decoder turn"
    )
    parser.add_argument(
        "--no-cudnn-sdp",
        action="store_true",
        help="turn off PyTorch's cuDNN attention backend (torch.backends.cuda.enable_cudnn_sdp)",
    )
    parser.add_argument("--grpo-steps", type=int, default=3)
    parser.add_argument("--grpo-groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # exactness in fp32 means no TF32
    torch.backends.cudnn.allow_tf32 = False
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    bad = [d for d in args.real_decoders if d not in REAL_DECODERS]
    bad += [g for g in args.real_generate if g not in ("dynamic", "static")]
    if bad:
        raise SystemExit(
            f"unknown --real-decoders/--real-generate values {bad}; decoders: "
            f"{', '.join(REAL_DECODERS)}; generate: dynamic, static"
        )
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"exact", "real", "grpo"}
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; choose from exact, real, grpo")
    report: Figures = {
        "device": str(device),
        "torch": torch.__version__,
        "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
    }
    import transformers

    report["transformers"] = transformers.__version__
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    print(json.dumps(report))
    with tempfile.TemporaryDirectory() as tmp:
        tiny_dir = build_tiny_qwen3_vl(Path(tmp) / "tiny")
        for section in sections:
            start = time.perf_counter()
            if section == "exact":
                report["exact"] = check_exact(device, tiny_dir, args)
            elif section == "real":
                report["real"] = check_real(device, args)
            else:
                report["grpo"] = check_grpo(device, tiny_dir, args)
            report[section]["section_s"] = time.perf_counter() - start
            if args.json:  # after every section: a later one may not finish
                args.json.write_text(json.dumps(report, indent=2, default=str))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
