"""Several GPU learning runs in one picture: each run's evaluations on the training tasks (new
phone) with their 95 % intervals over tasks, the gain in the legend, unseen tasks beneath.

    uv run python bench/experiments/plot_gpu_runs.py OUT.png LABEL=RUN/gpu_learning.json [LABEL=...]

Reads the ``gpu_learning.json`` that ``bench/experiments/learning_gpu.py`` writes (its ``points`` and
``gain``, each with ``train_tasks`` and ``unseen_tasks``) and refuses a file without them. An
argument that is an existing file is read with its file name as label. A label that starts
with ``clean`` is drawn dashed, so a reference run (``--early-stop-share 0``) stands apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.experiments.learning_gpu import errorbar_rates

COLORS = ["#dc2626", "#2563eb", "#16a34a", "#d97706", "#9333ea", "#0891b2", "#be185d"]


PARTS = ("train_tasks", "unseen_tasks")


def load(spec: str) -> tuple[str, dict[str, Any]]:
    """``LABEL=PATH`` or an existing ``PATH`` → (label, the run's summary).

    Raises ``ValueError`` when the summary lacks a point's or the gain's rates."""
    if Path(spec).is_file():
        label, path = Path(spec).stem, spec
    else:
        label, _, path = spec.partition("=")
    summary = json.loads(Path(path).read_text())
    try:
        for point in summary["points"]:
            for part in PARTS:
                _ = point["step"], point[part]["rate"], point[part]["low"], point[part]["high"]
        for part in PARTS:
            _ = summary["gain"][part]["difference"]
    except (KeyError, TypeError) as missing:
        raise ValueError(
            f"{path}: not a bench/experiments/learning_gpu.py summary (no {missing})"
        ) from None
    return label, summary


def draw(runs: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(7.5, 6.4), dpi=110, sharex=True, height_ratios=[3, 1.3]
    )
    for index, (label, summary) in enumerate(runs):
        color = COLORS[index % len(COLORS)]
        style = "--" if label.startswith("clean") else "-"
        points = summary["points"]
        offset = (index - (len(runs) - 1) / 2) * 0.15  # side by side, centred on the step
        xs = [p["step"] + offset for p in points]
        for axis, part in zip((top, bottom), PARTS, strict=True):
            gain = summary["gain"][part]
            errorbar_rates(
                axis,
                xs,
                points,
                part,
                f"{label}: {gain['difference']:+.1%} [{gain['low']:+.1%}, {gain['high']:+.1%}]",
                capsize=3,
                linestyle=style,
                color=color,
            )
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("success")
    top.set_title("training tasks on a new phone (baseline at step -1), 95% CI over tasks")
    top.legend(fontsize=7, loc="lower right", title="gain, last eval - baseline", title_fontsize=7)
    highest = max(p["unseen_tasks"]["high"] for _, s in runs for p in s["points"])
    bottom.set_ylim(-0.02, max(0.6, highest + 0.4))  # room above the bars for the legend
    bottom.legend(fontsize=6, loc="upper center", ncol=3, title="gain", title_fontsize=6)
    bottom.set_ylabel("success")
    bottom.set_title("unseen tasks (eval split)", fontsize=9)
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("runs", nargs="+", help="LABEL=path/to/gpu_learning.json")
    args = parser.parse_args()
    try:
        runs = [load(spec) for spec in args.runs]
    except (OSError, ValueError) as error:
        print(f"plot_gpu_runs: {error}", file=sys.stderr)
        return 2
    draw(runs, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
