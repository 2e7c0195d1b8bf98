"""AReaL's stat names → the Training Monitor's step and eval columns.

AReaL 1.0.4 exports flat names: the actor's ``ppo_actor/update/actor_loss/avg``,
``ppo_actor/update/grad_norm``, ``ppo_actor/update/lr``; rollout stats under the workflow's
scope (``rollout/…`` for training, ``eval-rollout/…`` for evals) such as the CUA workflow's
``rollout/cua/reward/avg``; timings under ``timeperf/…``. Every stat also goes to the step's
``metrics`` as is.
"""

from __future__ import annotations

from collections.abc import Mapping

STEP_COLUMNS: dict[str, tuple[str, ...]] = {
    "loss": ("ppo_actor/update/actor_loss/avg", "ppo_actor/update/actor_loss"),
    "grad_norm": ("ppo_actor/update/grad_norm", "ppo_actor/update/grad_norm/avg"),
    "lr": ("ppo_actor/update/lr", "ppo_actor/update/lr/avg"),
    "kl": ("ppo_actor/update/kl/avg", "ppo_actor/update/approx_kl/avg"),
    "reward_mean": ("rollout/cua/reward/avg", "rollout/cua/reward"),
    "n_seqs": ("ppo_actor/n_seqs", "ppo_actor/update/n_seqs"),
    "num_tokens": ("ppo_actor/n_tokens", "ppo_actor/update/n_tokens"),
}
"""Monitor column → AReaL names, first present wins (names differ by AReaL minor version)."""


def _first(stats: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        value = stats.get(name)
        if value is not None:
            return float(value)
    return None


def step_row_stats(stats: Mapping[str, float]) -> dict[str, float]:
    """The stats with the monitor's column names added (``TrainingMonitor.step_finished``)."""
    out = {k: float(v) for k, v in stats.items() if isinstance(v, int | float)}
    for column, names in STEP_COLUMNS.items():
        value = _first(stats, names)
        if value is not None:
            out[column] = value
    return out


def eval_results(stats: Mapping[str, float], scope: str = "eval-rollout") -> dict[str, float]:
    """Success rate and mean reward of the eval rollout's episodes (``cua/…`` stats)."""
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
