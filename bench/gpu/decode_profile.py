"""Batch-1 decode of the in-process engine: tok/s beside the HBM bound, and where one decode
step's time goes (issue 41: batch 1 at 37.9 % of the bound, goal 50 %).

The real shape: ``bench/gpu/gpu_check.py``'s random 2.13 B Qwen3-VL in bf16, one MAI-UI turn with
three real-size screenshots (1088x2400, 7,650 image tokens), 256 new tokens, the engine's
``slots`` decoder as configured by default (CUDA graphs, compiled elementwise kernels).
``--tiny --device cpu``: the tiny model and its small screenshots, for a smoke test.

1. Throughput: ``--runs`` turns per sampling mode (``greedy``; ``sample``: temperature 1.0 as
   ``bench/gpu/gpu_prefill.py`` decodes) and per decode loop (``--loops``: ``overlap``, the
   CUDA default: step t+1 launched before step t's tokens are read, and each layer's q/k/v and
   gate/up projections run as one product each; ``unstacked``: the same without stacking;
   ``step_by_step``: the engine before both; one engine each on the same model, their runs
   interleaved, the ratios printed and the tokens compared), decode tok/s = (tokens - 1) / (latency - time to first
   token), median; the bound is the text weights + the row's KV read once per step at the
   copy bandwidth measured here (``gpu_check.HbmBound``).
2. Profile: ``torch.profiler`` over one more turn per mode (all threads: the engine decodes on
   its worker thread), with the engine's decode step,
   prefill and sampling marked (``record_function``). Each decode step is the time from one
   ``decode.step`` to the next (the worker loop's own work included); its GPU kernels are
   those it launched (by correlation id: the CUDA graph's replay, the sampler's kernels), so
   per step: kernel time by category (matmul, attention, norm/rope/elementwise, sampling,
   copies, other), GPU idle time (launch gaps: the host's work between the graph replays),
   the host's time inside the step's input preparation and graph launch, inside sampling, in
   host synchronisations, and the rest of the loop. On CPU the categories are the step's
   operators' self time.

Writes ``OUT/decode_profile.json`` (figures, per-category shares, the top kernels) and, with
``--keep-traces``, ``OUT/trace_<mode>.json`` (the chrome trace of the profiled turn, which
decodes ``--profile-tokens``: the step is the same at any length, the trace is not).

    python bench/gpu/decode_profile.py --out OUT                  # on the GPU machine
    uv run python bench/gpu/decode_profile.py --device cpu --tiny --out OUT --new-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from bench.gpu.gpu_check import (
    REAL_MAX_PIXELS,
    REAL_MIN_PIXELS,
    HbmBound,
    build_prompts,
    generate,
    real_size_model,
)
from cua_native.engine import InProcessEngine, InProcessEngineConfig, inprocess
from cua_native.engine.slots import SlotDecoder

Figures = dict[str, Any]
MODES: dict[str, dict[str, Any]] = {"greedy": {"greedy": True}, "sample": {"temperature": 1.0}}
MARKS: dict[tuple[Any, str], str] = {
    (SlotDecoder, "step"): "decode.step",
    (SlotDecoder, "fill"): "decode.prefill",
    (InProcessEngine, "_sample"): "decode.sample",
    # overlapped decode: the sampler's launch, and the read of the step in flight
    (inprocess, "launch_sample_rows"): "decode.sample",
    (InProcessEngine, "_apply"): "decode.sample",
}
LOOPS: dict[str, dict[str, bool]] = {
    "default": {"overlap_decode": True, "stack_projections": True},
    "unstacked": {"overlap_decode": True, "stack_projections": False},
    "step_by_step": {"overlap_decode": False, "stack_projections": False},
}
"""Decode loops compared: the CUDA default (step ``t+1`` launched before step ``t``'s tokens
are read, each layer's q/k/v and gate/up projections one product each), the same without
stacked projections, and the engine before both (each step's tokens read before the next,
the model's own projections)."""
CATEGORIES = ("matmul", "attention", "norm_rope_elementwise", "sampling", "copies", "other")
MATMUL_NAMES = ("gemm", "gemv", "cutlass", "xmma", "cublas", "nvjet", "splitk", "matmul", "mm_")
"""Kernel-name parts of matrix products (cuBLAS/cuBLASLt incl. Hopper's ``nvjet`` kernels)."""
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
"""Host-side CUDA calls (triton's kernels are launched through the driver API)."""
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaStreamWaitEvent",
)


# ---------------------------------------------------------------------------- set-up
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="the tiny model (smoke test)")
    parser.add_argument("--out", type=Path, required=True, help="folder for JSON and traces")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3, help="timed turns per mode")
    parser.add_argument("--modes", default="greedy,sample", help=f"of {list(MODES)}")
    parser.add_argument("--top", type=int, default=25, help="kernels listed")
    parser.add_argument(
        "--profile-tokens", type=int, default=64, help="new tokens of the profiled turn"
    )
    parser.add_argument("--keep-traces", action="store_true", help="keep OUT/trace_<mode>.json")
    parser.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help=f"decode loops compared, of {list(LOOPS)} (the first is the figure)",
    )
    parser.add_argument("--real-layers", type=int, default=28)
    parser.add_argument("--real-vision-depth", type=int, default=24)
    parser.add_argument("--real-max-pixels", type=int, default=REAL_MAX_PIXELS)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown mode(s) {bad}: choose from {list(MODES)}")
    if min(args.new_tokens, args.profile_tokens) < 8 or args.runs < 1 or args.top < 1:
        parser.error("--new-tokens and --profile-tokens must be >= 8, --runs and --top >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --tiny)")
    args.modes = modes
    loops = args.loops.split(",")
    if not loops or any(loop not in LOOPS for loop in loops) or len(set(loops)) != len(loops):
        parser.error(f"--loops {args.loops}: a list of distinct names from {list(LOOPS)}")
    args.loops = loops
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out {args.out}: {exc}")
    return args


def model_and_prompt(
    args: argparse.Namespace, device: torch.device
) -> tuple[Any, Any, ModelRequest]:
    """The model, its processor and the third turn of an episode (three screenshots)."""
    from cua_native.models.tiny import TinySpec, build_model, build_processor, build_tokenizer

    tokenizer = build_tokenizer()
    if args.tiny:
        processor = build_processor(tokenizer)
        model = build_model(tokenizer).to(device).eval()
        pixels: dict[str, int] = {}
    else:
        spec = TinySpec(min_pixels=REAL_MIN_PIXELS, max_pixels=args.real_max_pixels)
        processor = build_processor(tokenizer, spec)
        model = real_size_model(tokenizer, device, args)
        pixels = {"min_pixels": REAL_MIN_PIXELS, "max_pixels": args.real_max_pixels}
    gconfig = GenerationHyperparameters(max_new_tokens=args.new_tokens, ignore_eos=True)
    requests = asyncio.run(build_prompts(processor, 3, lambda i: gconfig, **pixels))
    return model, processor, requests[2]


def with_mode(req: ModelRequest, mode: str) -> ModelRequest:
    return dataclasses.replace(req, gconfig=dataclasses.replace(req.gconfig, **MODES[mode]))


@contextmanager
def marked() -> Iterator[None]:
    """Each call of the engine's decode step, prefill and sampling inside a
    ``record_function`` range of its name (``MARKS``); restored on exit."""
    originals = [(cls, name, getattr(cls, name), label) for (cls, name), label in MARKS.items()]

    def wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            with torch.profiler.record_function(label):
                return fn(*a, **k)

        return call

    for cls, name, fn, label in originals:
        setattr(cls, name, wrap(fn, label))
    try:
        yield
    finally:
        for cls, name, fn, _ in originals:
            setattr(cls, name, fn)


# ---------------------------------------------------------------------------- measuring
def decode_rate(engine: InProcessEngine, req: ModelRequest) -> tuple[float, list[int]]:
    (resp,), _, _ = asyncio.run(generate(engine, [req], concurrent=False))
    rate = (len(resp.output_tokens) - 1) / (resp.latency - resp.ttft)
    return rate, list(resp.output_tokens)


def interleaved(
    engines: dict[str, InProcessEngine], req: ModelRequest, runs: int
) -> dict[str, Figures]:
    """``throughput`` of each engine, their runs interleaved (the order turned each run) so
    that drift of the machine falls on both sides alike."""
    rates: dict[str, list[float]] = {loop: [] for loop in engines}
    tokens: dict[str, list[int]] = {}
    names = list(engines)
    for run in range(runs):
        for loop in names if run % 2 == 0 else names[::-1]:
            rate, out = decode_rate(engines[loop], req)
            rates[loop].append(rate)
            tokens.setdefault(loop, out)
    return {
        loop: {"tok_s": statistics.median(r), "tok_s_runs": r, "tokens": tokens[loop]}
        for loop, r in rates.items()
    }


def profiled_trace(engine: InProcessEngine, req: ModelRequest, path: Path) -> Figures:
    """One turn under ``torch.profiler`` with the marks; the chrome trace saved and read."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    # the engine decodes on its own worker thread: record every thread's operators
    config = torch._C._profiler._ExperimentalConfig(
        profile_all_threads=True, enable_cuda_sync_events=True
    )
    with marked(), profile(activities=activities, experimental_config=config) as prof:
        decode_rate(engine, req)
    prof.export_chrome_trace(str(path))
    trace: Figures = json.loads(path.read_text())
    return trace


# ---------------------------------------------------------------------------- the trace
def kernel_category(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(k in low for k in MATMUL_NAMES) or (
        low.startswith("aten::") and low.split("::")[1] in ("mm", "addmm", "bmm", "linear")
    ):
        return "matmul"
    if low.startswith("memcpy") or low.startswith("memset") or "copy" in low:
        return "copies"
    if any(k in low for k in ("triton", "rms", "norm", "rope", "rotary", "silu", "elementwise")):
        return "norm_rope_elementwise"
    if low.startswith("aten::") and low.split("::")[1] in ("mul", "add", "sub", "div", "pow"):
        return "norm_rope_elementwise"
    return "other"


def _inside(ts: float, ranges: list[tuple[float, float]]) -> bool:
    return any(lo <= ts < hi for lo, hi in ranges)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def _self_times(ops: list[Figures]) -> list[tuple[Figures, float]]:
    """Each CPU operator with its self time (its duration less its children's), per thread."""
    out: list[tuple[Figures, float]] = []
    by_thread: dict[Any, list[Figures]] = defaultdict(list)
    for op in ops:
        by_thread[op.get("tid")].append(op)
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list[Any]] = []  # [event, child time]
        for op in thread_ops:
            while stack and op["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                done, child = stack.pop()
                out.append((done, done["dur"] - child))
            if stack:
                stack[-1][1] += op["dur"]
            stack.append([op, 0.0])
        while stack:
            done, child = stack.pop()
            out.append((done, done["dur"] - child))
    return out


def breakdown(trace: Figures, top: int) -> Figures:
    """Per decode step (steps 3.. of the turn, so no capture or first-step effects)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    marks: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"] in MARKS.values():
            marks[e["name"]].append((e["ts"], e["ts"] + e["dur"]))
    starts = sorted(lo for lo, _ in marks["decode.step"])
    if len(starts) < 6:
        raise RuntimeError(f"only {len(starts)} decode steps in the trace")
    lo, hi = starts[2], starts[-1]  # whole steps: each from one step's start to the next
    steps = len(starts) - 3
    in_window = [e for e in events if lo <= e["ts"] < hi]
    sample_ranges = [r for r in marks["decode.sample"] if lo <= r[0] < hi]
    step_ranges = [r for r in marks["decode.step"] if lo <= r[0] < hi]
    runtime = {
        e["args"]["correlation"]: e
        for e in in_window
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    # GPU kernels and copies: launched in the window (by correlation), else run in it
    device_events = [
        e
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        and (e.get("args", {}).get("correlation") in runtime or lo <= e["ts"] < hi)
    ]
    categories: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    if device_events:
        for e in device_events:
            launch = runtime.get(e.get("args", {}).get("correlation"))
            in_sampling = launch is not None and _inside(launch["ts"], sample_ranges)
            category = "copies" if e.get("cat") != "kernel" else kernel_category(e["name"])
            if in_sampling and category != "copies":
                category = "sampling"
            categories[category] += e["dur"]
            kernels[e["name"]][0] += e["dur"]
            kernels[e["name"]][1] += 1
        busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in device_events])
        syncs = [
            e
            for e in in_window
            if e.get("cat") in LAUNCH_CATEGORIES and e["name"].split("_v")[0] in SYNC_CALLS
        ]
        sync_us = sum(e["dur"] for e in syncs)
        graph_launches = sum(
            1
            for e in in_window
            if e.get("cat") in LAUNCH_CATEGORIES and e["name"].startswith("cudaGraphLaunch")
        )
        kernel_launches = sum(
            1
            for e in in_window
            if e.get("cat") in LAUNCH_CATEGORIES
            and e["name"].startswith(("cudaLaunchKernel", "cuLaunchKernel"))
        )
    else:  # CPU: the operators' self time inside the window, by the same names
        ops = [e for e in in_window if e.get("cat") == "cpu_op"]
        for op, self_us in _self_times(ops):
            category = kernel_category(op["name"])
            if _inside(op["ts"], sample_ranges):
                category = "sampling"
            categories[category] += self_us
            kernels[op["name"]][0] += self_us
            kernels[op["name"]][1] += 1
        busy = sum(categories.values())
        sync_us, graph_launches, kernel_launches = 0.0, 0, 0
    step_us = (hi - lo) / steps
    host_step = sum(b - a for a, b in step_ranges) / steps
    host_sample = sum(b - a for a, b in sample_ranges) / steps
    per_step = {k: v / steps for k, v in categories.items()}
    idle = step_us - busy / steps
    shares = {k: v / step_us for k, v in per_step.items()}
    shares["idle_launch_gaps"] = idle / step_us
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": steps,
        "step_us": step_us,
        "device_busy_us": busy / steps,
        "idle_us": idle,
        "category_us": per_step,
        "share_of_step": shares,
        "host": {
            "step_call_us": host_step,
            "sample_call_us": host_sample,
            "loop_rest_us": step_us - host_step - host_sample,
            "sync_calls_us": sync_us / steps,
            "graph_launches_per_step": graph_launches / steps,
            "kernel_launches_per_step": kernel_launches / steps,
        },
        "top_kernels": [
            {
                "name": name,
                "category": kernel_category(name),
                "us_per_step": total / steps,
                "calls_per_step": calls / steps,
                "share_of_step": total / steps / step_us,
            }
            for name, (total, calls) in ranked
        ],
    }


def show(mode: str, rate: Figures, bound: float | None, parts: Figures) -> None:
    fraction = (
        f"{100 * rate['tok_s'] / bound:.1f} % of the HBM bound {bound:.0f}"
        if bound
        else "no HBM bound on CPU"
    )
    print(f"\n[{mode}] batch-1 decode {rate['tok_s']:.1f} tok/s = {fraction}")
    print(
        f"  one step {parts['step_us']:.0f} us under the profiler ({1e6 / rate['tok_s']:.0f} "
        f"us without; mean of {parts['steps']}): device busy "
        f"{parts['device_busy_us']:.0f} us, idle {parts['idle_us']:.0f} us"
    )
    for name, share in parts["share_of_step"].items():
        us = parts["category_us"].get(name, parts["idle_us"])
        print(f"    {name:<24}{us:9.1f} us {100 * share:6.1f} %")
    host = parts["host"]
    print(
        f"  host per step: step() {host['step_call_us']:.0f} us, sampling "
        f"{host['sample_call_us']:.0f} us, rest of the loop {host['loop_rest_us']:.0f} us; "
        f"sync calls {host['sync_calls_us']:.0f} us; {host['graph_launches_per_step']:.1f} graph "
        f"and {host['kernel_launches_per_step']:.1f} kernel launches"
    )
    print("  top kernels (us per step, share):")
    for k in parts["top_kernels"][:12]:
        print(
            f"    {k['us_per_step']:8.1f} {100 * k['share_of_step']:5.1f} %  [{k['category']}] {k['name'][:90]}"
        )


def main(argv: list[str] | None = None) -> Figures:
    args = parse_args(argv)
    device = torch.device(args.device)
    report: Figures = {"device": str(device), "torch": torch.__version__, "tiny": args.tiny}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    model, processor, req = model_and_prompt(args, device)
    report["prompt_tokens"] = len(req.input_ids)
    report["new_tokens"] = args.new_tokens
    hbm = HbmBound.measure(model, device, args.new_tokens)
    bound = hbm.tok_s([len(req.input_ids)]) if device.type == "cuda" else None
    report["hbm"] = hbm.figures() | {"bound_tok_s": bound}
    print(json.dumps(report))
    engines = {
        loop: InProcessEngine(
            model,
            processor,
            config=InProcessEngineConfig(
                device=str(device),
                max_batch_size=1,
                overlap_decode=LOOPS[loop]["overlap_decode"],
                stack_projections=LOOPS[loop]["stack_projections"],
            ),
        )
        for loop in args.loops
    }
    for engine in engines.values():
        engine.initialize()
    config = next(iter(engines.values())).config
    report["engine"] = {
        "decoder": next(iter(engines.values())).decoder_kind,
        "cuda_graphs": config.cuda_graphs,
        "decode_compile": config.decode_compile,
        "loops": args.loops,
    }
    out_file = args.out / "decode_profile.json"
    try:
        for mode in args.modes:
            mode_req = with_mode(req, mode)
            for engine in engines.values():
                decode_rate(engine, mode_req)  # warm-up: compiles, captures the graph
            rates = interleaved(engines, mode_req, args.runs)
            profile_req = dataclasses.replace(
                mode_req,
                gconfig=dataclasses.replace(mode_req.gconfig, max_new_tokens=args.profile_tokens),
            )
            for loop, engine in engines.items():
                key = mode if loop == args.loops[0] else f"{mode}/{loop}"
                rate = rates[loop]
                trace_path = args.out / f"trace_{key.replace('/', '_')}.json"
                trace = profiled_trace(engine, profile_req, trace_path)
                if not args.keep_traces:
                    trace_path.unlink()
                parts = breakdown(trace, args.top)
                report[key] = {
                    "loop": loop,
                    "tok_s": rate["tok_s"],
                    "unprofiled_step_us": 1e6 / rate["tok_s"],
                    "tok_s_runs": rate["tok_s_runs"],
                    "fraction_of_bound": None if bound is None else rate["tok_s"] / bound,
                    "first_tokens": rate["tokens"][:16],
                    "same_tokens_as_first_loop": rate["tokens"] == rates[args.loops[0]]["tokens"],
                    "profile": parts,
                }
                show(key, rate, bound, parts)
            if len(engines) > 1:
                first, *others = args.loops
                report[mode]["ratio_to"] = {
                    loop: rates[first]["tok_s"] / rates[loop]["tok_s"] for loop in others
                }
                for loop in others:
                    print(
                        f"[{mode}] {first} / {loop}: x{report[mode]['ratio_to'][loop]:.2f} "
                        f"(interleaved runs; same tokens: "
                        f"{report[f'{mode}/{loop}']['same_tokens_as_first_loop']})"
                    )
            out_file.write_text(json.dumps(report, indent=2))
    finally:
        for engine in engines.values():
            engine.destroy()
    print(f"\nwrote {out_file}")
    return report


if __name__ == "__main__":
    main()
