"""CPU A/B of the slots decoder's step and batched sampler against another revision's.

Loads ``text_step.py`` and ``sampling.py`` from ``--baseline`` (the root of another
checkout, e.g. one of ``main``) beside this checkout's, in one process, and times
``TextStack.forward`` (eager, matmul attention) and ``sample_rows`` on the tiny Qwen3-VL,
alternating the two revisions call by call, so a loaded machine slows both alike. Prints
medians and the ratio (this checkout / baseline; below 1 is faster).

    uv run python bench/perf/engine_step_ab.py --baseline ../main [--reps 100] [--batches 1,8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText

from bench.perf.revision import load
from cua_native.engine import sampling, text_step
from cua_native.engine.kv_arena import KVArena
from cua_native.models.tiny import build_tiny_qwen3_vl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout's root")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args()
    engine_dir = args.baseline / "cua_native" / "engine"
    if not (engine_dir / "text_step.py").is_file() or args.reps < 1:
        raise SystemExit(f"no cua_native/engine/text_step.py under {args.baseline}, or reps < 1")
    batches = [int(b) for b in args.batches.split(",")]
    old_step = load("baseline_text_step", engine_dir / "text_step.py")
    old_sampling = load("baseline_sampling", engine_dir / "sampling.py")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_qwen3_vl(Path(tmp) / "tiny")
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    params = sampling.SamplingParams(
        greedy=False,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=64,
        min_new_tokens=0,
        stop_token_ids=frozenset({1}),
        never_sample=frozenset({3, 4}),
    )
    revisions = {
        "baseline": (old_step.TextStack(model, "matmul"), old_sampling.sample_rows),
        "this": (text_step.TextStack(model, "matmul"), sampling.sample_rows),
    }
    print(f"torch threads: {torch.get_num_threads()}")
    with torch.inference_mode():
        for batch in batches:
            stack = revisions["this"][0]
            arena = KVArena(
                stack.layers,
                stack.kv_heads,
                stack.head_dim,
                torch.float32,
                torch.device("cpu"),
                64,
            )
            arena.fit(batch, 200)
            inputs = text_step.StepInputs(
                torch.randint(0, 100, (batch,)),
                torch.arange(batch) + 150,
                torch.arange(batch) + 150,
            )
            steps: dict[str, list[float]] = {k: [] for k in revisions}
            samples: dict[str, list[float]] = {k: [] for k in revisions}
            for rep in range(args.reps):
                order = list(revisions) if rep % 2 else list(reversed(revisions))
                for name in order:
                    step, sample_rows = revisions[name]
                    start = time.perf_counter()
                    logits = step.forward(arena, batch, inputs)
                    steps[name].append(time.perf_counter() - start)
                    start = time.perf_counter()
                    sample_rows(logits, [params] * batch, [5] * batch, [0.3] * batch)
                    samples[name].append(time.perf_counter() - start)
            step_ms = {k: 1000 * statistics.median(v) for k, v in steps.items()}
            sample_ms = {k: 1000 * statistics.median(v) for k, v in samples.items()}
            print(
                f"batch {batch}: step {step_ms['this']:.2f} ms vs baseline "
                f"{step_ms['baseline']:.2f} ms (x{step_ms['this'] / step_ms['baseline']:.2f}); "
                f"sample_rows {sample_ms['this']:.3f} vs {sample_ms['baseline']:.3f} ms "
                f"(x{sample_ms['this'] / sample_ms['baseline']:.2f})"
            )


if __name__ == "__main__":
    main()
