"""Learning at scale on one GPU: a bigger Qwen3-VL (tens of millions of parameters, built
locally), warm-started on every training-split sim task, then GRPO with more tasks and steps.

    uv run python bench/experiments/learning_gpu.py --out runs/learning-gpu [--seed S] [KEY=VALUE ...]

The warm start: 1,000 steps of 8 demonstrated turns (26 tasks on phones 0-3, lr 5e-4; 400
steps left a fifth of its own turns unlearned: bench/experiments/results/warm-start-caps-the-gpu-run/README.md#warm-start-caps-the-gpu-run),
with the embedded default's early stops: each demonstrated path that has a step after its first
action and before its last also ends once, on a step drawn among those, with
``terminate(success)`` (``--early-stop-share 1.0 --early-stop-after 1``; one-action paths get
none; ``--early-stop-share 0`` keeps clean paths, bench/experiments/results/learned-turns/README.md#learned-turns). Its other
settings are the bench's own (no goal in the thought, unlike ``configs/default.yaml``). Every
step plays every training task (26 tasks x 4 episodes, each task on its next phone), as the
embedded default does; no KL term (no reference forward per row), learning rate 1e-4 (at 2e-4
one run collapsed into short, failing episodes: bench/experiments/results/every-task-every-step/README.md#every-task-every-step).
20 steps, evaluated after the 10th and the 20th (``e9``, ``e19`` in the monitor; more steps
gained nothing: bench/experiments/results/early-stop-after-progress/README.md#early-stop-after-progress). The model's rotary base is 1e4,
not Qwen3-VL's 5e6 (``--rope-theta``). The evaluation plays every task 4 times (132 episodes).
Figures and logs: the experiments from bench/experiments/results/every-task-every-step/README.md#every-task-every-step
to bench/experiments/results/learned-turns/README.md#learned-turns (the list: docs/results.md#experiments).

The fixed evaluation set is every sim task on a phone (gym seed) that no demonstration and no
training step uses, so one evaluation measures both: the **training tasks on new seeds** and
the **unseen tasks** of the eval split, reported side by side (each with its 95 % bootstrap
interval over tasks, and the gain over the baseline with a paired interval). Writes
``gpu_learning.json`` and ``gpu_learning.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from cua_native.config import WarmStart
from cua_native.models.tiny import TinySpec, build_tiny_qwen3_vl
from cua_native.rollout.dataset import TaskSource, select_tasks
from cua_native.rollout.factories import tokenizer_corpus
from cua_native.rollout.outcomes import paired_difference, task_interval

BIG = TinySpec(
    hidden_size=768,
    layers=4,
    heads=12,
    kv_heads=4,
    head_dim=64,
    intermediate_size=3072,
    vision_depth=2,
    vision_hidden_size=256,
    vision_heads=4,
    vision_intermediate_size=1024,
    rope_theta=10_000.0,
)
"""Wide and shallow: 43.5 M parameters in four layers. The train engine runs row by row, so on
a GPU a step's time follows the number of layers (kernel launches), not their width."""
SIM_OPTIONS = {"screenshot_size": [160, 384]}
PROMPT = {"max_pixels": 65536}
EVAL_SEED = 1000


def bench_warm_start() -> WarmStart:
    """The bench's warm start, the defaults of ``--warm-steps``, ``--warm-lr``,
    ``--warm-batch`` and ``--warm-gym-seeds``; ``bench/experiments/imitation.py --spec big`` uses it too."""
    return WarmStart(steps=1000, lr=5e-4, batch_size=8, gym_seeds=[0, 1, 2, 3])


def parameter_count(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            total += sum(f.get_tensor(key).numel() for key in f.keys())
    return total


def split_ids() -> tuple[list[str], list[str]]:
    """Task ids of the sim's train and eval splits (the trainer's defaults)."""
    from cua_native.gym.sim.tasks import catalogue

    tasks = catalogue()
    train = [t.task_id for t in select_tasks(tasks, TaskSource(split="train"))]
    unseen = [t.task_id for t in select_tasks(tasks, TaskSource(split="eval"))]
    return train, unseen


def summarize(evals: dict[str, Any], train_ids: list[str], unseen_ids: list[str]) -> dict[str, Any]:
    """Per evaluation: success on training tasks (new seeds) and on unseen tasks, intervals."""
    base = evals["baseline"]
    out: dict[str, Any] = {"points": [], "gain": {}}
    runs = [("-1", base), *evals["evals"].items()]
    for step, outcomes in runs:
        row: dict[str, Any] = {"step": int(step)}
        for name, ids in (("train_tasks", train_ids), ("unseen_tasks", unseen_ids)):
            part = {t: v for t, v in outcomes.items() if t in ids}
            i = task_interval(part)
            row[name] = {
                "rate": i.estimate,
                "low": i.low,
                "high": i.high,
                "episodes": sum(len(v) for v in part.values()),
            }
        out["points"].append(row)
    last = evals["evals"][max(evals["evals"], key=int)]
    for name, ids in (("train_tasks", train_ids), ("unseen_tasks", unseen_ids)):
        d = paired_difference(
            {t: v for t, v in base.items() if t in ids}, {t: v for t, v in last.items() if t in ids}
        )
        out["gain"][name] = {"difference": d.estimate, "low": d.low, "high": d.high}
    return out


def errorbar_rates(
    axis: Any, xs: list[float], points: list[dict[str, Any]], part: str, label: str, **style: Any
) -> None:
    """One part's evaluation rates (``train_tasks`` or ``unseen_tasks``) with their 95 %
    intervals, as ``gpu_learning.json`` stores them; ``bench/experiments/plot_gpu_runs.py`` draws with it too."""
    axis.errorbar(
        xs,
        [p[part]["rate"] for p in points],
        yerr=[
            [p[part]["rate"] - p[part]["low"] for p in points],
            [p[part]["high"] - p[part]["rate"] for p in points],
        ],
        marker="s",
        label=label,
        **style,
    )


def plot(summary: dict[str, Any], train: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), dpi=110)
    for key, color, label in (
        ("success", "#16a34a", "train batch success"),
        ("reward", "#2563eb", "train reward"),
    ):
        ax1.plot(
            [r["step"] for r in train], [r[key] for r in train], color=color, alpha=0.7, label=label
        )
    ax1.set_xlabel("step")
    ax1.set_title("training batches")
    ax1.legend(fontsize=7)
    for name, color, label in (
        ("train_tasks", "#dc2626", "training tasks, new seeds"),
        ("unseen_tasks", "#9333ea", "unseen tasks (eval split)"),
    ):
        pts = summary["points"]
        g = summary["gain"][name]
        errorbar_rates(
            ax2,
            [p["step"] if p["step"] >= 0 else -1 for p in pts],
            pts,
            name,
            f"{label}: {g['difference']:+.0%} [{g['low']:+.0%}, {g['high']:+.0%}]",
            capsize=4,
            color=color,
        )
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("step (baseline at -1)")
    ax2.set_title("eval success, 95% CI over tasks")
    ax2.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


WARM_MADE_WITH = "bench_made_with.json"
"""Beside a warm start this bench trained: the model spec and warm-start settings it used."""


def reused_warm_start(warm_dir: Path, made_with: dict[str, Any]) -> dict[str, Any]:
    """The report of a finished warm start at ``warm_dir`` made with ``made_with``; exits with
    one line if it is unfinished or was made otherwise (a reused warm start must be the one this
    run would have trained)."""
    from cua_native.training.warmstart.sft import WARM_START_MARKER

    marker, recorded = warm_dir / WARM_START_MARKER, warm_dir / WARM_MADE_WITH
    if not marker.is_file() or not recorded.is_file():
        sys.exit(f"--warm-from {warm_dir}: no finished warm start of this bench there")
    if json.loads(recorded.read_text()) != json.loads(json.dumps(made_with)):
        sys.exit(f"--warm-from {warm_dir}: made with another seed, model or warm-start settings")
    report: dict[str, Any] = json.loads(marker.read_text())
    return report


def main() -> int:
    warm = bench_warm_start()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/learning-gpu"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warm-steps", type=int, default=warm.steps)
    parser.add_argument("--warm-batch", type=int, default=warm.batch_size)
    parser.add_argument("--warm-lr", type=float, default=warm.lr)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--eval-every", type=int, default=10, help="evaluate every N steps and after the last"
    )
    parser.add_argument(
        "--rope-theta",
        type=float,
        default=BIG.rope_theta,
        help="the model's rotary base (Qwen3-VL's own is 5e6; bench/experiments/results/rotary-base/README.md#rotary-base)",
    )
    parser.add_argument(
        "--warm-gym-seeds",
        type=int,
        default=len(warm.gym_seeds),
        help="phones (gym seeds 0..N-1) each training task is demonstrated on",
    )
    parser.add_argument(
        "--goal-in-thought",
        action="store_true",
        help="demonstrated thoughts restate the instruction (cua.warm_start.goal_in_thought); "
        "pass cua.agent.sampling.max_new_tokens=128 with it",
    )
    parser.add_argument(
        "--early-stop-share",
        type=float,
        default=1.0,
        help="share of demonstrated paths that also stop early at one step "
        "(cua.warm_start.early_stop_share; "
        "bench/experiments/results/imperfect-demonstrator/README.md#imperfect-demonstrator)",
    )
    parser.add_argument(
        "--early-stop-after",
        type=int,
        default=1,
        help="an early stop falls only after this many of the path's actions "
        "(cua.warm_start.early_stop_after; the embedded default uses 1; "
        "bench/experiments/results/early-stop-after-progress/README.md#early-stop-after-progress)",
    )
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="stop after the warm start (OUT/warm), for runs that share it through --warm-from",
    )
    parser.add_argument(
        "--warm-from",
        type=Path,
        default=None,
        help="reuse the finished warm start of another run (its OUT/warm) instead of training "
        "one; refused unless it was made with the same seed, model and warm-start settings",
    )
    parser.add_argument("overrides", nargs="*", help="trainer config overrides")
    args = parser.parse_args()
    if args.warm_only and args.warm_from is not None:
        parser.error("--warm-only trains a warm start; --warm-from reuses one: pass one of them")

    from cua_native.train import main as train_main
    from cua_native.training.warmstart.demos import source_for
    from cua_native.training.warmstart.sft import warm_start

    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    spec = dataclasses.replace(BIG, rope_theta=args.rope_theta)
    base = build_tiny_qwen3_vl(args.out / "base", spec, tokenizer_corpus())
    params = parameter_count(base)
    print(f"model: {params / 1e6:.1f} M parameters", flush=True)
    train_ids, unseen_ids = split_ids()
    warm_dir = args.out / "warm"
    settings = WarmStart(
        steps=args.warm_steps,
        lr=args.warm_lr,
        batch_size=args.warm_batch,
        seed=args.seed,
        gym_seeds=list(range(args.warm_gym_seeds)),
        goal_in_thought=args.goal_in_thought,
        early_stop_share=args.early_stop_share,
        early_stop_after=args.early_stop_after,
    )
    made_with = {"spec": dataclasses.asdict(spec), "warm_start": settings.model_dump(mode="json")}
    if args.warm_from is not None:
        warm_dir = args.warm_from
        warm_report = reused_warm_start(warm_dir, made_with)
        print(f"warm start: reused {warm_dir} (made in {warm_report['seconds']:.0f} s)", flush=True)
    else:
        report = warm_start(
            base,
            warm_dir,
            settings,
            family="mai_ui",
            prompt_overrides=PROMPT,
            tasks=TaskSource(split="train"),
            gym_seeds=tuple(settings.gym_seeds),
            demo_source=source_for("mai_ui", SIM_OPTIONS),
            device=args.device,
        )
        (warm_dir / WARM_MADE_WITH).write_text(json.dumps(made_with, indent=2))
        warm_report = report.to_json()
        print(
            f"warm start: {report.steps} steps, loss {report.first_loss:.3f} -> "
            f"{report.last_loss:.4f}, {report.demos} demos, {report.seconds:.0f} s",
            flush=True,
        )
        if args.warm_only:
            return 0
    run_dir = args.out / "run"
    code = train_main(
        [
            "--no-progress",
            "--model",
            str(warm_dir),
            "--run-dir",
            str(run_dir),
            "--device",
            args.device,
            "--steps",
            str(args.steps),
            f"seed={args.seed}",
            "cua.tasks.split=train",
            "cua.tasks.task_ids=null",
            "cua.tasks.gym_seeds=[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]",
            "cua.eval_tasks.split=all",
            "cua.eval_tasks.task_ids=null",
            f"cua.eval_tasks.gym_seeds=[{EVAL_SEED}]",
            "cua.agent.max_turns=10",
            f"train_dataset.batch_size={len(train_ids)}",
            "cua.agent.group_size=4",
            "cua.agent.sampling.max_new_tokens=96",
            f"cua.eval_every={args.eval_every}",
            "cua.eval_episodes_per_task=4",
            "actor.optimizer.lr=1e-4",
            "actor.kl_ctl=0",
            "actor.recompute_logprob=false",
            "cua.skip_uniform_groups=true",
            *args.overrides,
        ]
    )
    if code != 0:
        return code
    evals = json.loads((run_dir / "evals.json").read_text())
    summary = summarize(evals, train_ids, unseen_ids)
    summary.update(
        parameters=params,
        warm_start=warm_report | {"losses": None},
        seconds=time.perf_counter() - started,
        steps=args.steps,
        train_tasks=len(train_ids),
        unseen_tasks=len(unseen_ids),
    )
    (args.out / "gpu_learning.json").write_text(json.dumps(summary, indent=2))
    print()
    for p in summary["points"]:
        name = "baseline" if p["step"] < 0 else f"eval after step {p['step']}"
        cells = [
            f"{k.replace('_', ' ')} {p[k]['rate']:.0%} [{p[k]['low']:.0%}, {p[k]['high']:.0%}]"
            f" ({p[k]['episodes']} ep)"
            for k in ("train_tasks", "unseen_tasks")
        ]
        print(f"{name:<20} " + "   ".join(cells))
    for k, g in summary["gain"].items():
        print(
            f"gain on {k.replace('_', ' ')}: {g['difference']:+.1%} "
            f"(paired 95% CI [{g['low']:+.1%}, {g['high']:+.1%}])"
        )
    print(f"total {summary['seconds']:.0f} s")
    plot(
        summary,
        evals["train"],
        args.out / "gpu_learning.png",
        f"{params / 1e6:.0f} M-parameter Qwen3-VL, {len(train_ids)} training tasks, "
        f"{args.steps} GRPO steps on {args.device}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
