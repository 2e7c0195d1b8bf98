"""What a finished embedded run prints and draws: a step table, a reward/success curve, and
where to find the database, the checkpoint and the dashboard."""

from __future__ import annotations

import shlex
from pathlib import Path

from cua_native.training.embedded import TrainReport


def plot_curves(report: TrainReport, path: Path) -> Path | None:
    """Reward mean (with std band) and success rate per step, as a PNG."""
    if not report.steps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s.step for s in report.steps]
    mean = [s.reward_mean for s in report.steps]
    std = [s.reward_std for s in report.steps]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=110)
    ax1.plot(steps, mean, marker="o", color="#2563eb", label="reward mean")
    ax1.fill_between(
        steps,
        [m - s for m, s in zip(mean, std, strict=True)],
        [m + s for m, s in zip(mean, std, strict=True)],
        color="#2563eb",
        alpha=0.15,
    )
    ax1.set_xlabel("step")
    ax1.set_title("episode reward")
    ax2.plot(
        steps, [s.success_rate for s in report.steps], marker="o", color="#16a34a", label="train"
    )
    if report.evals:
        ax2.plot(
            list(report.evals),
            list(report.evals.values()),
            marker="s",
            color="#dc2626",
            label="eval",
        )
    if report.baseline_success is not None:
        ax2.axhline(report.baseline_success, color="#6b7280", linestyle="--", label="baseline")
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("step")
    ax2.set_title("success rate")
    ax2.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def print_report(report: TrainReport) -> None:
    print()
    print(
        f"{'step':>4} {'episodes':>8} {'success':>8} {'reward':>8} {'±':>6} {'turns':>6} "
        f"{'samples':>7} {'loss':>8} {'sec':>6}"
    )
    for s in report.steps:
        loss = f"{s.loss:8.4f}" if s.loss is not None else f"{'-':>8}"
        print(
            f"{s.step:>4} {s.episodes:>8} {s.success_rate:>8.0%} {s.reward_mean:>8.3f} "
            f"{s.reward_std:>6.3f} {s.turns_mean:>6.1f} {s.samples:>7} {loss} {s.seconds:>6.1f}"
        )
    if report.baseline_success is not None:
        print(f"baseline success rate: {report.baseline_success:.0%}")
    for step, rate in report.evals.items():
        print(f"eval after step {step}: success rate {rate:.0%}")
    plot = plot_curves(report, report.run_dir / "reward_curve.png")
    print()
    print(f"run directory:   {report.run_dir}")
    if report.monitor_url:
        print(f"monitor db:      {report.monitor_url}")
    if report.checkpoint:
        print(f"checkpoint:      {report.checkpoint}")
    if plot:
        print(f"reward curve:    {plot}")
    db = report.monitor_url or f"sqlite:///{report.run_dir / 'monitor.db'}"
    print(
        "dashboard:       uv run python -m cua_native.monitor serve "
        f"--db {shlex.quote(db)} --run-dir {shlex.quote(str(report.run_dir))}  "
        "(then open http://127.0.0.1:8765)"
    )
