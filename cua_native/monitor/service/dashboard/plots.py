"""Small server-side SVG line charts (no JavaScript, no network)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Any

from cua_native.rollout.outcomes import task_interval

PALETTE = ("#2563eb", "#16a34a", "#dc2626", "#9333ea")


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    points: list[tuple[float, float]]
    intervals: list[tuple[float, float, float]] = field(default_factory=list)
    """``(x, low, high)`` error bars drawn at the points."""
    connect: bool = True


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def line_chart(title: str, series: list[Series], width: int = 640, height: int = 220) -> str:
    """An inline ``<svg>`` line chart of ``series``; a note instead when there is no data."""
    points = [p for s in series for p in s.points if math.isfinite(p[1])]
    if not points:
        return f'<p class="empty">{escape(title)}: no data yet</p>'
    left, right, top, bottom = 48, 12, 24, 28
    xs = [p[0] for p in points]
    ys = [p[1] for p in points] + [v for s in series for _, lo, hi in s.intervals for v in (lo, hi)]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" class="tick">{_fmt(y_hi)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="tick">{_fmt(y_lo)}</text>',
        f'<text x="{left}" y="{height - 8}" class="tick">{_fmt(x_lo)}</text>',
        f'<text x="{left + plot_w}" y="{height - 8}" text-anchor="end" class="tick">'
        f"{_fmt(x_hi)}</text>",
    ]
    for index, item in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        finite = sorted(p for p in item.points if math.isfinite(p[1]))
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in finite)
        if item.connect:
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"'
                f' data-series="{escape(item.label)}"/>'
            )
        for x, lo, hi in item.intervals:
            px = sx(x)
            parts.append(
                f'<path d="M{px:.1f},{sy(lo):.1f}V{sy(hi):.1f}M{px - 4:.1f},{sy(lo):.1f}'
                f'h8M{px - 4:.1f},{sy(hi):.1f}h8" stroke="{color}" fill="none"'
                f' class="interval"><title>{escape(item.label)} @ {_fmt(x)}: '
                f"95% CI {_fmt(lo)} to {_fmt(hi)}</title></path>"
            )
        parts.extend(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
            f"<title>{escape(item.label)} @ {_fmt(x)}: {_fmt(y)}</title></circle>"
            for x, y in finite
        )
        parts.append(
            f'<text x="{left + plot_w - 4}" y="{top + 14 * (index + 1)}" text-anchor="end"'
            f' fill="{color}" class="legend">{escape(item.label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def eval_chart(data: dict[str, Any]) -> str | None:
    """Baseline (at step -1) and every evaluation's success rate, each with its 95 % bootstrap
    interval over tasks (``rollout.outcomes.task_interval``); ``None`` without either."""
    outcomes = data.get("outcomes", {})
    series = []
    for kind, rows, label in (
        ("baseline", data["baselines"], "baseline"),
        ("eval", data["evals"], "eval"),
    ):
        points, intervals = [], []
        for row in rows:
            per_task = outcomes.get((kind, row.id))
            x = -1.0 if kind == "baseline" else float(row.step)
            if per_task:
                interval = task_interval(per_task)
                points.append((x, interval.estimate))
                intervals.append((x, interval.low, interval.high))
            elif row.success_rate is not None:
                points.append((x, row.success_rate))
        if points:
            series.append(Series(label, points, intervals, connect=kind == "eval"))
    if not series:
        return None
    return line_chart("baseline and eval success rate (95% CI over tasks)", series)
