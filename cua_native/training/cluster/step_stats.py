"""Eval results from AReaL's stats: the eval rollout's CUA stats (``eval-rollout/cua/…``, the
workflow's ``record_group_stats`` under AReaL's eval scope) → the monitor's eval/baseline
columns. Step columns are mapped by the monitor (``lifecycle.areal_step_columns``)."""

from __future__ import annotations

from collections.abc import Mapping


def _first(stats: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        value = stats.get(name)
        if value is not None:
            return float(value)
    return None


def eval_results(stats: Mapping[str, float], scope: str = "eval-rollout") -> dict[str, float]:
    """Success rate, mean reward and mean turns of the eval rollout's episodes."""
    results: dict[str, float] = {}
    for key, names in (
        ("success_rate", (f"{scope}/cua/success/avg", f"{scope}/cua/success")),
        ("avg_reward", (f"{scope}/cua/reward/avg", f"{scope}/cua/reward")),
        ("avg_turns", (f"{scope}/cua/turns/avg", f"{scope}/cua/turns")),
    ):
        value = _first(stats, names)
        if value is not None:
            results[key] = value
    return results
