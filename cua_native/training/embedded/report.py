"""What a finished embedded run prints and draws: a step table, the evaluations with their
intervals and the measured gain, a reward/success curve, and where to find the database, the
checkpoint and the dashboard. ``evals.json`` in the run directory keeps every evaluation's
per-task outcomes (``bench/experiments/learning.py`` reads it)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cua_native.rollout.outcomes import Interval, paired_difference, task_interval
from cua_native.training.embedded.trainer import TrainReport, step_table_header


@dataclass(frozen=True, slots=True)
class EvalPoint:
    """One evaluation of the fixed set: ``step`` -1 is the baseline."""

    step: int
    rate: Interval
    episodes: int


@dataclass(frozen=True, slots=True)
class Gain:
    """The last evaluation against the baseline on the same episodes."""

    baseline: float
    final: float
    step: int
    difference: Interval
    tasks: int
    episodes: int


def eval_points(report: TrainReport) -> list[EvalPoint]:
    """Baseline (step -1) and every evaluation, each with its bootstrap interval over tasks."""
    return [
        EvalPoint(step, task_interval(r.outcomes), sum(len(v) for v in r.outcomes.values()))
        for step, r in sorted(report.evaluations.items())
        if r.outcomes
    ]


def gain(report: TrainReport) -> Gain | None:
    """The last evaluation's success rate minus the baseline's, with a paired 95 % bootstrap
    interval over tasks; ``None`` without both."""
    after = report.after_steps
    if report.baseline is None or not report.baseline.outcomes or not after:
        return None
    base = report.baseline.outcomes
    step = max(after)
    final = after[step].outcomes
    if not final:
        return None
    diff = paired_difference(base, final)
    shared = set(base) & set(final)
    return Gain(
        baseline=_rate(base, shared),
        final=_rate(final, shared),
        step=step,
        difference=diff,
        tasks=len(shared),
        episodes=sum(len(final[t]) for t in shared),
    )


def _rate(outcomes: dict[str, list[bool]], tasks: set[str]) -> float:
    n = sum(len(outcomes[t]) for t in tasks)
    return sum(sum(outcomes[t]) for t in tasks) / n if n else 0.0


def write_evals(report: TrainReport, path: Path) -> Path:
    """Every evaluation's per-task outcomes and the gain, as JSON."""
    found = gain(report)
    data: dict[str, Any] = {
        "baseline": None if report.baseline is None else report.baseline.outcomes,
        "evals": {str(k): r.outcomes for k, r in report.after_steps.items()},
        "points": [
            {
                "step": p.step,
                "rate": p.rate.estimate,
                "low": p.rate.low,
                "high": p.rate.high,
                "episodes": p.episodes,
                "parse_errors_per_turn": report.evaluations[p.step].parse_errors_per_turn,
                "false_done": report.evaluations[p.step].false_done_rate,
            }
            for p in eval_points(report)
        ],
        "gain": None
        if found is None
        else {
            "baseline": found.baseline,
            "final": found.final,
            "step": found.step,
            "difference": found.difference.estimate,
            "low": found.difference.low,
            "high": found.difference.high,
            "tasks": found.tasks,
            "episodes": found.episodes,
        },
        "train": [
            {
                "step": s.step,
                "success": s.success_rate,
                "reward": s.reward_mean,
                "adv_abs": s.adv_abs,
                "logp_gap": s.logp_gap,
                "seconds": s.seconds,
                "episodes": s.episodes,
                "samples": s.samples,
                "uniform_groups": s.uniform_groups,
                "groups": s.groups,
                "env_steps": s.env_steps,
                "root_success": s.root_success,
                "branch_points": s.branch_points,
                "extra_env_steps": s.extra_env_steps,
                "signal_groups": s.signal_groups,
                "replayed_samples": s.replayed_samples,
            }
            for s in report.steps
        ],
    }
    path.write_text(json.dumps(data, indent=2))
    return path


def plot_curves(report: TrainReport, path: Path) -> Path | None:
    """Reward mean (with std band) per step; success rate per step (train) with the baseline
    and every evaluation of the fixed set, each with its 95 % interval, as a PNG."""
    if not report.steps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s.step for s in report.steps]
    mean = [s.reward_mean for s in report.steps]
    std = [s.reward_std for s in report.steps]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    ax1.plot(steps, mean, marker="o", color="#2563eb", label="reward mean")
    ax1.fill_between(
        steps,
        [m - s for m, s in zip(mean, std, strict=True)],
        [m + s for m, s in zip(mean, std, strict=True)],
        color="#2563eb",
        alpha=0.15,
    )
    ax1.set_xlabel("step")
    ax1.set_title("episode reward (train)")
    ax2.plot(
        steps,
        [s.success_rate for s in report.steps],
        marker="o",
        color="#16a34a",
        alpha=0.6,
        label="train batch",
    )
    points = eval_points(report)
    base = [p for p in points if p.step < 0]
    evals = [p for p in points if p.step >= 0]
    for group, color, marker, label in (
        (base, "#6b7280", "D", "baseline"),
        (evals, "#dc2626", "s", "eval"),
    ):
        if not group:
            continue
        xs = [p.step if p.step >= 0 else -0.5 for p in group]
        ys = [p.rate.estimate for p in group]
        ax2.errorbar(
            xs,
            ys,
            yerr=[
                [p.rate.estimate - p.rate.low for p in group],
                [p.rate.high - p.rate.estimate for p in group],
            ],
            marker=marker,
            color=color,
            capsize=4,
            linestyle="-" if label == "eval" else "none",
            label=f"{label} ({group[0].episodes} episodes, 95% CI)",
        )
    if base:
        ax2.axhline(base[0].rate.estimate, color="#6b7280", linestyle="--", linewidth=0.8)
    found = gain(report)
    title = "success rate"
    if found is not None:
        d = found.difference
        title += f": gain {d.estimate:+.0%} [{d.low:+.0%}, {d.high:+.0%}]"
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("step (baseline at -0.5)")
    ax2.set_title(title, fontsize=10)
    ax2.legend(loc="best", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _fmt_interval(i: Interval) -> str:
    return f"{i.estimate:.0%} (95% CI {i.low:.0%} to {i.high:.0%})"


def print_report(report: TrainReport, *, step_table: bool = True) -> None:
    """The run's summary; ``step_table=False`` leaves out the step table (a run without
    progress bars printed each row as its step finished)."""
    if step_table:
        print()
        print(step_table_header(report.credit))
        for s in report.steps:
            print(s.table_row(report.credit))
    print()
    for point in eval_points(report):
        name = "baseline" if point.step < 0 else f"eval after step {point.step}"
        result = report.evaluations[point.step]
        shown = (
            f", {result.parse_errors_per_turn:.0%} of turns unparseable, "
            f"{result.false_done_rate:.0%} ended in a failed done"
        )
        print(
            f"{name + ':':<22} success {_fmt_interval(point.rate)}, "
            f"{point.episodes} episodes{shown}"
        )
    found = gain(report)
    if found is not None:
        d = found.difference
        verdict = "excludes 0" if d.excludes_zero() else "includes 0"
        print(
            f"gain (last eval - baseline): {found.baseline:.0%} -> {found.final:.0%} = "
            f"{d.estimate:+.1%}, paired 95% CI over {found.tasks} tasks "
            f"[{d.low:+.1%}, {d.high:+.1%}] ({verdict}; {found.episodes} episodes each)"
        )
    evals_json = write_evals(report, report.run_dir / "evals.json")
    plot = plot_curves(report, report.run_dir / "reward_curve.png")
    print()
    print(f"run directory:   {report.run_dir}")
    if report.monitor_url:
        print(f"monitor db:      {report.monitor_url}")
    if report.checkpoint:
        print(f"checkpoint:      {report.checkpoint}")
    print(f"evaluations:     {evals_json}")
    if plot:
        print(f"reward curve:    {plot}")
    if report.monitor_url is None:
        print("dashboard:       none here (cua.monitor_db=null: no local monitor database)")
        return
    print(
        "dashboard:       uv run python -m cua_native.monitor serve "
        f"--db {shlex.quote(report.monitor_url)} --run-dir {shlex.quote(str(report.run_dir))}  "
        "(then open http://127.0.0.1:8765)"
    )
