"""Warm start of the tiny Qwen3-VL on sim demonstrations: time, loss, and what it achieved.

    uv run python bench/experiments/warm_start.py [--steps 300] [--lr 2e-3] [--batch-size 8] [--family mai_ui]

Prints the warm start's figures, then first-step parse and match rates of the base and the
warm-started model (greedy and sampled at temperature 1.0) on the held-out (eval split) sim
tasks, decoded with the real ``InProcessEngine``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import torch

from cua_native.config import WarmStart
from cua_native.models.tiny import build_tiny_qwen3_vl
from cua_native.prompts import default_prompt_config, dialect_for
from cua_native.rollout.dataset import TaskSource
from cua_native.training.warmstart.demos import Demo, DemoSpec, collect_demos
from cua_native.training.warmstart.sft import FirstStepScore, score_first_steps, warm_start


async def _scores(
    model_dir: Path, family: str, demos: list[Demo], samples: int
) -> list[FirstStepScore]:
    from cua_native.engine import InProcessEngine

    engine = await asyncio.to_thread(InProcessEngine.from_pretrained, model_dir, seed=0)
    try:
        dialect = dialect_for(default_prompt_config(family))
        greedy = await score_first_steps(engine, demos, dialect, engine.tokenizer, greedy=True)
        sampled = await score_first_steps(
            engine, demos, dialect, engine.tokenizer, greedy=False, samples=samples
        )
        return [greedy, sampled]
    finally:
        await asyncio.to_thread(engine.destroy)


def _show(name: str, scores: list[FirstStepScore]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in scores:
        print(
            f"{name:>6} {s.mode:>7}: parse {s.parse_rate:6.1%}  match {s.match_rate:6.1%}  "
            f"({s.prompts} generations)"
        )
        out[f"{name}_{s.mode}_parse"] = s.parse_rate
        out[f"{name}_{s.mode}_match"] = s.match_rate
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=WarmStart().steps)
    parser.add_argument("--lr", type=float, default=WarmStart().lr)
    parser.add_argument("--batch-size", type=int, default=WarmStart().batch_size)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", default="mai_ui", choices=["mai_ui", "qwen3_vl"])
    parser.add_argument("--samples", type=int, default=4, help="sampled draws per prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-base", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = WarmStart(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny_qwen3_vl(Path(tmp) / "tiny")
        out = Path(tmp) / "warm"
        report = warm_start(
            base, out, settings, args.family, None, progress=True, num_threads=args.threads
        )
        print(
            f"warm start: {report.demos} demos of {report.tasks} tasks, {report.steps} steps "
            f"(batch {settings.batch_size}, lr {settings.lr}); loss {report.first_loss:.3f} -> "
            f"{report.last_loss:.3f}; demos {report.demo_seconds:.1f}s, train "
            f"{report.train_seconds:.1f}s, total {report.seconds:.1f}s"
        )
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(out)
        start = time.perf_counter()
        held_out = [
            d
            for d in collect_demos(
                processor, DemoSpec(family=args.family, tasks=TaskSource(split="eval"))
            )
            if d.step == 0
        ]
        print(f"held-out first steps: {len(held_out)} ({time.perf_counter() - start:.1f}s)")
        figures: dict[str, float] = {"seconds": report.seconds, "last_loss": report.last_loss}
        if not args.skip_base:
            figures |= _show(
                "base", asyncio.run(_scores(base, args.family, held_out, args.samples))
            )
        figures |= _show("warm", asyncio.run(_scores(out, args.family, held_out, args.samples)))
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
