"""The decode step's matrix products at batch 1: which formulation reads the weights fastest.

The batch-1 decode profile (``bench/gpu/decode_profile.py``) puts about 1.9 ms of a 3.3 ms
step in cuBLAS's M = 1 matrix products, reading 3.44 GB of weights at ~1.8 TB/s against a
copy bandwidth of ~4.3 TB/s. This bench times each weight shape of the real model (text 2048
x 28 layers, MLP 6144, 16 query / 8 key-value heads of 128, vocabulary 151,936; bf16) the
ways a decode step could run it, each inside a CUDA graph of ``--repeat`` calls (as the
step is replayed) and measured with CUDA events:

* ``linear``: ``F.linear(x, W)`` with ``x`` ``[rows, K]``: what the step does today;
* ``mv``: ``torch.mv(W, x[0])`` (rows = 1 only): cuBLAS's GEMV entry point;
* ``matmul_t``: ``(W @ x.T).T``: the weight as the left operand;
* the fused shapes a step could use instead of several products (``qkv``: the three
  projections of one layer's attention stacked; ``gate_up``: the MLP's two input projections).

Per shape and way: microseconds per call, the weights' read rate (GB/s) and its share of the
copy bandwidth measured in the same run; then the step's total per way (28 layers' seven
products + the output head, or the fused five + the head), the saving against ``linear``,
and the largest relative difference of each way's output from ``linear``'s (bf16).

    python bench/gpu/gemv_shapes.py --out OUT [--rows 1] [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.gpu.gpu_check import copy_bandwidth

HIDDEN, MLP, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 2048, 6144, 16, 8, 128, 28, 151936
SHAPES = {
    "q_proj": (HEADS * HEAD_DIM, HIDDEN),
    "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "o_proj": (HIDDEN, HEADS * HEAD_DIM),
    "gate_proj": (MLP, HIDDEN),
    "up_proj": (MLP, HIDDEN),
    "down_proj": (HIDDEN, MLP),
    "lm_head": (VOCAB, HIDDEN),
    "qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
    "gate_up": (2 * MLP, HIDDEN),
}
"""Weight shapes ``(out, in)`` of the real model's text stack."""
PER_STEP = {
    "separate": {
        **{n: LAYERS for n in ("q_proj", "k_proj", "v_proj", "o_proj")},
        **{n: LAYERS for n in ("gate_proj", "up_proj", "down_proj")},
        "lm_head": 1,
    },
    "fused": {
        "qkv": LAYERS,
        "o_proj": LAYERS,
        "gate_up": LAYERS,
        "down_proj": LAYERS,
        "lm_head": 1,
    },
}
"""Calls per decode step of each shape, with the projections as the model has them and with
the attention's three and the MLP's two input projections stacked."""

Way = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
WAYS: dict[str, Way] = {
    "linear": lambda x, w: torch.nn.functional.linear(x, w),
    "mv": lambda x, w: torch.mv(w, x[0])[None],
    "matmul_t": lambda x, w: (w @ x.T).T,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=1, help="rows of x (the batch)")
    parser.add_argument("--repeat", type=int, default=50, help="calls per graph replay")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    if args.rows < 1 or args.repeat < 1 or args.replays < 3:
        parser.error("--rows, --repeat >= 1 and --replays >= 3")
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def time_way(way: Way, x: torch.Tensor, weights: list[torch.Tensor], replays: int) -> float:
    """Microseconds per call: the calls cycle through ``weights`` (distinct copies, so the
    L2 cache holds none of them between calls) inside one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in weights[:3]:
            way(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            way(x, w)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(weights))
    return float(statistics.median(times))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    ways = {k: v for k, v in WAYS.items() if k != "mv" or args.rows == 1}
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "rows": args.rows,
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "shapes": {},
    }
    print(f"{report['gpu']}, copy bandwidth {bandwidth / 1e12:.2f} TB/s, rows {args.rows}")
    gen = torch.Generator(device=device).manual_seed(0)
    for name, (out_features, in_features) in SHAPES.items():
        # enough distinct copies that the graph's calls read ~1 GB (L2 holds ~50-60 MB)
        size = out_features * in_features * 2
        copies = max(2, min(args.repeat, (2**30) // size))
        weights = [
            torch.randn(out_features, in_features, device=device, generator=gen).to(torch.bfloat16)
            / in_features**0.5
            for _ in range(copies)
        ]
        x = torch.randn(args.rows, in_features, device=device, generator=gen).to(torch.bfloat16)
        ref = torch.nn.functional.linear(x, weights[0]).float()
        row: dict[str, Any] = {"bytes": size}
        for way_name, way in ways.items():
            us = time_way(way, x, weights, args.replays)
            diff = ((way(x, weights[0]).float() - ref).abs().max() / ref.abs().max()).item()
            row[way_name] = {
                "us": us,
                "gb_s": size / (us / 1e6) / 1e9,
                "share_of_bandwidth": size / (us / 1e6) / bandwidth,
                "max_rel_diff_vs_linear": diff,
            }
        best = min(ways, key=lambda w: row[w]["us"])
        row["best"] = best
        report["shapes"][name] = row
        print(
            f"  {name:<10} {size / 1e6:7.1f} MB  "
            + "  ".join(
                f"{w} {row[w]['us']:7.1f} us {100 * row[w]['share_of_bandwidth']:4.0f} %"
                for w in ways
            )
        )
        del weights
        torch.cuda.empty_cache()
    steps: dict[str, Any] = {}
    for layout, calls in PER_STEP.items():
        for way_name in [*ways, "best"]:
            total = sum(
                n
                * report["shapes"][s][
                    report["shapes"][s]["best"] if way_name == "best" else way_name
                ]["us"]
                for s, n in calls.items()
            )
            steps[f"{layout}/{way_name}"] = total
    today = steps["separate/linear"]
    report["step_matmul_us"] = steps
    print("per decode step (matrix products only):")
    for key, total in steps.items():
        print(f"  {key:<20} {total:8.0f} us  (saves {today - total:6.0f} us vs separate/linear)")
    (args.out / "gemv_shapes.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
