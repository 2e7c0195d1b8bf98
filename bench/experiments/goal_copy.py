"""Does a warm-started model read its instruction? Per task, on phones it never saw: how often
the thought's restated goal is the task's own instruction, and how often the action is right.

    uv run python bench/experiments/goal_copy.py --model runs/.cache/tiny-qwen3-vl-warm-mai_ui-<key> \\
        [--phones 1000 1001 1002 1003] [--task-ids sim-009 sim-010]

The model must have been warm-started with ``cua.warm_start.goal_in_thought`` (thoughts begin
"Goal: <instruction>"). Every demonstrated turn of the embedded default's tasks on ``--phones``
is generated greedily (``warm_start.demo_reply``) from the demonstrated history (teacher-forced);
the restated goal counts as copied when the output contains "Goal: <the task's instruction>".
``--examples`` prints each task's first reply beside its demonstrated text.
Figures: bench/experiments/results/every-task-every-step/README.md#every-task-every-step and #rotary-base.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from pathlib import Path

from cua_native.config import load_config
from cua_native.gym.sim.tasks import catalogue
from cua_native.prompts import default_prompt_config, dialect_for
from cua_native.training.warmstart.demos import (
    Demo,
    DemoSpec,
    collect_demos,
    same_action,
    source_for,
)
from cua_native.training.warmstart.sft import demo_reply


async def score(
    model_dir: Path, demos: list[Demo], family: str, examples: bool = False
) -> dict[str, list[int]]:
    """Per task: [turns, goal copied, action right]; ``examples`` prints each task's first
    reply against its demonstrated text."""
    from areal.api.cli_args import GenerationHyperparameters

    from cua_native.engine import InProcessEngine
    from cua_native.rollout.factories import stop_token_ids

    instructions = {t.task_id: t.instruction.strip() for t in catalogue()}
    dialect = dialect_for(default_prompt_config(family))
    engine = await asyncio.to_thread(InProcessEngine.from_pretrained, model_dir, device="cpu")
    gconfig = GenerationHyperparameters(
        n_samples=1,
        max_new_tokens=128,
        greedy=True,
        stop_token_ids=stop_token_ids(engine.tokenizer),
    )
    try:
        texts = await asyncio.gather(
            *(demo_reply(engine, demo, gconfig, engine.tokenizer) for demo in demos)
        )
    finally:
        await asyncio.to_thread(engine.destroy)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for demo, text in zip(demos, texts, strict=True):
        parsed = dialect.parse(text, image_size=demo.image_size)
        right = (
            parsed.ok
            and parsed.action is not None
            and same_action(parsed.action, demo.action, 0.05)
        )
        row = counts[demo.task_id]
        if examples and row[0] == 0:
            print(f"{demo.task_id} wrote: {text[:160]!r}")
            print(f"{'':<{len(demo.task_id)}} demo:  {demo.text[:160]!r}")
        row[0] += 1
        row[1] += f"Goal: {instructions[demo.task_id]}" in text
        row[2] += right
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a warm-started model dir")
    parser.add_argument("--phones", type=int, nargs="+", default=[1000, 1001, 1002, 1003])
    parser.add_argument("--task-ids", nargs="+", help="default: the embedded default's tasks")
    parser.add_argument("--family", default="mai_ui")
    parser.add_argument("--examples", action="store_true", help="print each task's first reply")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: no config.json there (not a model directory)")

    from transformers import AutoProcessor

    cua = load_config(None).cua
    tasks = cua.tasks.model_copy(
        update={"gym_seeds": None, "task_ids": args.task_ids or cua.tasks.task_ids}
    )
    options = dict(cua.agent.gym.options)
    spec = DemoSpec(
        args.family,
        dict(cua.agent.prompt),
        tasks,
        tuple(args.phones),
        goal_in_thought=True,
    )
    processor = AutoProcessor.from_pretrained(str(args.model))
    demos = collect_demos(processor, spec, source_for(args.family, options))
    counts = asyncio.run(score(args.model, demos, args.family, args.examples))
    total = [0, 0, 0]
    print(f"{'task':<10} {'turns':>5} {'goal copied':>12} {'action right':>13}")
    for task_id, (turns, copied, right) in sorted(counts.items()):
        print(f"{task_id:<10} {turns:>5} {copied / turns:>12.0%} {right / turns:>13.0%}")
        total = [a + b for a, b in zip(total, (turns, copied, right), strict=True)]
    print(f"{'all':<10} {total[0]:>5} {total[1] / total[0]:>12.0%} {total[2] / total[0]:>13.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
