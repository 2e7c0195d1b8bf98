"""Evaluation outcomes per task, and how sure a change in success rate is.

An evaluation is a fixed set of episodes (the same tasks and gym seeds every time). Episodes of
one task are correlated (same instruction, same screens), so intervals resample **tasks**, not
episodes: ``task_interval`` for one evaluation's success rate and ``paired_difference`` for the
change between two evaluations of the same set (each resampled task contributes its episodes
to both rates, so task difficulty cancels out). Percentile bootstrap, seeded: the same outcomes
always give the same interval.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the dashboard imports the statistics without the rollout stack
    from cua_native.rollout.records import EpisodeContext, EpisodeRecord, TurnRecord

Outcomes = Mapping[str, Sequence[bool]]
"""Task id → the success of each of its (non-rejected) evaluation episodes."""

RESAMPLES = 10_000


@dataclass(slots=True)
class TaskOutcomes:
    """An episode observer that keeps every finished episode's success under its task id."""

    by_task: dict[str, list[bool]] = field(default_factory=dict)

    def episode_started(self, context: EpisodeContext) -> None:
        return None

    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None:
        return None

    def episode_finished(self, record: EpisodeRecord) -> None:
        if record.outcome == "rejected":
            return
        self.by_task.setdefault(record.context.task.task_id, []).append(bool(record.success))


def success_rate(outcomes: Outcomes) -> float:
    """Episode-weighted success rate of ``outcomes`` (0 when there is no episode)."""
    n = sum(len(v) for v in outcomes.values())
    return sum(sum(v) for v in outcomes.values()) / n if n else 0.0


def _percentiles(values: list[float], level: float) -> tuple[float, float]:
    values.sort()
    tail = (1.0 - level) / 2.0
    lo = values[int(tail * (len(values) - 1))]
    hi = values[round((1.0 - tail) * (len(values) - 1))]
    return lo, hi


@dataclass(frozen=True, slots=True)
class Interval:
    estimate: float
    low: float
    high: float

    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


def task_interval(
    outcomes: Outcomes, *, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """Success rate with a bootstrap interval over tasks."""
    tasks = sorted(outcomes)
    if not tasks:
        return Interval(0.0, 0.0, 0.0)
    counts = [(sum(outcomes[t]), len(outcomes[t])) for t in tasks]
    rng = random.Random(seed)
    rates: list[float] = []
    for _ in range(resamples):
        wins = total = 0
        for _ in tasks:
            w, n = counts[rng.randrange(len(counts))]
            wins, total = wins + w, total + n
        rates.append(wins / total if total else 0.0)
    return Interval(success_rate(outcomes), *_percentiles(rates, level))


def paired_difference(
    before: Outcomes,
    after: Outcomes,
    *,
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """``rate(after) - rate(before)`` on the tasks both evaluated, with a paired bootstrap
    interval over those tasks. Raises ``ValueError`` when they share no task."""
    tasks = sorted(set(before) & set(after))
    if not tasks:
        raise ValueError("the two evaluations share no task")
    pairs = [(sum(before[t]), len(before[t]), sum(after[t]), len(after[t])) for t in tasks]
    rng = random.Random(seed)
    diffs: list[float] = []
    for _ in range(resamples):
        bw = bn = aw = an = 0
        for _ in tasks:
            b_w, b_n, a_w, a_n = pairs[rng.randrange(len(pairs))]
            bw, bn, aw, an = bw + b_w, bn + b_n, aw + a_w, an + a_n
        diffs.append((aw / an if an else 0.0) - (bw / bn if bn else 0.0))
    shared_before = {t: before[t] for t in tasks}
    shared_after = {t: after[t] for t in tasks}
    estimate = success_rate(shared_after) - success_rate(shared_before)
    return Interval(estimate, *_percentiles(diffs, level))
