"""Does a warm start imitate its demonstrations, and on phones it has not seen? Builds a tiny
Qwen3-VL (``--spec tiny``: the embedded default's model, tasks and warm-start settings; ``--spec
big``: ``learning_gpu``'s 43.5 M-parameter model, its ``bench_warm_start()`` and the whole train
split), warm-starts it, then decodes every demonstrated turn of its training tasks with the
real ``InProcessEngine`` and compares the parsed action with the solution's: on two
demonstration phones (gym seeds 0, 1) and on the evaluation phone (``EVAL_SEED``), greedy and
sampled at temperature 1.0. Greedy runs also print one mark per turn for each task and phone
(``sim-019@0:....X..``: the fifth turn took another action); ``imitation.json`` keeps every
missed turn's reply.

    uv run python bench/experiments/imitation.py --spec tiny --device cpu --out runs/imitation-tiny
    uv run python bench/experiments/imitation.py --spec big --device cuda --out runs/imitation-big [--warm-steps 1000]

A gap between the two phones is imitation that does not generalise; misses on the
demonstration phones are turns the warm start has not learned, whose tasks RL then rarely
sees succeed (bench/experiments/results/stronger-warm-start/README.md#stronger-warm-start,
bench/experiments/results/warm-start-caps-the-gpu-run/README.md#warm-start-caps-the-gpu-run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.experiments.learning_gpu import (
    BIG,
    EVAL_SEED,
    PROMPT,
    SIM_OPTIONS,
    bench_warm_start,
    parameter_count,
)
from cua_native.config import load_config
from cua_native.models.tiny import TinySpec, build_tiny_qwen3_vl
from cua_native.prompts import default_prompt_config, dialect_for
from cua_native.rollout.dataset import TaskSource
from cua_native.rollout.factories import tokenizer_corpus
from cua_native.training.warmstart.demos import Demo, DemoSpec, collect_demos, source_for
from cua_native.training.warmstart.sft import (
    FirstStepScore,
    TurnOutcome,
    score_first_steps,
    warm_start,
)

FAMILY = "mai_ui"


async def score(model_dir: Path, device: str, demos: list[Demo]) -> list[FirstStepScore]:
    from cua_native.engine import InProcessEngine

    engine = await asyncio.to_thread(InProcessEngine.from_pretrained, model_dir, device=device)
    try:
        dialect = dialect_for(default_prompt_config(FAMILY))
        return [
            await score_first_steps(engine, demos, dialect, engine.tokenizer, greedy=True),
            await score_first_steps(
                engine, demos, dialect, engine.tokenizer, greedy=False, samples=2
            ),
        ]
    finally:
        await asyncio.to_thread(engine.destroy)


def turn_marks(turns: Sequence[TurnOutcome]) -> str:
    """``sim-001:.X.`` per task and phone: a turn's mark is ``.`` (the demonstrated action),
    ``X`` (another action) or ``?`` (unparseable), in the path's order."""
    marks: dict[tuple[str, int], list[str]] = defaultdict(list)
    for t in sorted(turns, key=lambda t: (t.task_id, t.gym_seed, t.step)):
        marks[(t.task_id, t.gym_seed)].append("." if t.matched else "X" if t.parsed else "?")
    return " ".join(f"{task}@{seed}:{''.join(m)}" for (task, seed), m in marks.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", choices=["tiny", "big"], default="tiny")
    parser.add_argument("--out", type=Path, default=Path("runs/imitation"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--warm-steps", type=int, help="default: the spec's")
    parser.add_argument("--warm-gym-seeds", type=int, help="phones 0..N-1; default: the spec's")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    default = load_config(None).cua
    if args.spec == "tiny":  # the embedded default, as configs/default.yaml sets it up
        spec, tasks, warm = TinySpec(), default.tasks.model_copy(), default.warm_start
        tasks = tasks.model_copy(update={"gym_seeds": None})
    else:  # bench/experiments/learning_gpu.py's run
        spec, tasks, warm = BIG, TaskSource(split="train"), bench_warm_start()
    warm = warm.model_copy(update={"seed": args.seed})
    if args.warm_steps is not None:
        warm = warm.model_copy(update={"steps": args.warm_steps})
    if args.warm_gym_seeds is not None:
        warm = warm.model_copy(update={"gym_seeds": list(range(args.warm_gym_seeds))})

    from transformers import AutoProcessor

    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    base = build_tiny_qwen3_vl(args.out / "base", spec, tokenizer_corpus())
    seen = list(warm.gym_seeds)
    source = source_for(FAMILY, SIM_OPTIONS)
    report = warm_start(
        base,
        args.out / "warm",
        warm,
        family=FAMILY,
        prompt_overrides=PROMPT,
        tasks=tasks,
        gym_seeds=tuple(seen),
        demo_source=source,
        device=args.device,
    )
    print(f"warm start: {report.steps} steps, loss {report.last_loss:.4f}, {report.demos} demos")
    processor = AutoProcessor.from_pretrained(str(args.out / "warm"))
    results: dict[str, dict[str, Any]] = {}
    for name, phones in (("seen phones", (0, 1)), ("new phone", (EVAL_SEED,))):
        demos = collect_demos(processor, DemoSpec(FAMILY, PROMPT, tasks, phones), source)
        for s in asyncio.run(score(args.out / "warm", args.device, demos)):
            results[f"{name} {s.mode}"] = {
                "parse": s.parse_rate,
                "match": s.match_rate,
                "misses": [asdict(t) for t in s.turns if not t.matched],
            }
            print(
                f"{name:>12} {s.mode:>7}: parse {s.parse_rate:6.1%}  match {s.match_rate:6.1%}"
                f"  ({s.prompts} generations over {len(demos)} demonstrated turns)",
                flush=True,
            )
            if s.mode == "greedy":
                print(f"{'':>21}per task, one mark a turn: {turn_marks(s.turns)}", flush=True)
    summary = {
        "spec": args.spec,
        "parameters": parameter_count(base),
        "warm_start": report.to_json() | {"losses": None},
        "scores": results,
        "seconds": time.perf_counter() - started,
    }
    (args.out / "imitation.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
