"""Bootstrap intervals over tasks for evaluation success rates and their paired difference."""

from __future__ import annotations

import pytest

from cua_native.gym.protocol import Task
from cua_native.rollout.outcomes import (
    TaskOutcomes,
    paired_difference,
    success_rate,
    task_interval,
)
from cua_native.rollout.records import EpisodeContext, EpisodeRecord


def test_success_rate_weights_episodes() -> None:
    assert success_rate({"a": [True, True, False, False], "b": [True]}) == pytest.approx(3 / 5)
    assert success_rate({}) == 0.0


def test_task_interval_brackets_the_rate_and_is_degenerate_when_tasks_agree() -> None:
    mixed = {f"t{i}": [i % 2 == 0] * 4 for i in range(12)}
    interval = task_interval(mixed)
    assert interval.low < interval.estimate == 0.5 < interval.high
    same = {f"t{i}": [True, False] for i in range(6)}
    assert task_interval(mixed) == task_interval(mixed)  # seeded: reproducible
    flat = task_interval(same)
    assert flat.low == flat.estimate == flat.high == 0.5


def test_paired_difference_sees_a_consistent_gain_that_an_unpaired_view_would_not() -> None:
    # Tasks differ wildly in difficulty; every task gains one success in four episodes.
    before = {f"t{i}": [True] * (i % 4) + [False] * (4 - i % 4) for i in range(12)}
    after = {t: [True] * (sum(v) + 1) + [False] * (3 - sum(v)) for t, v in before.items()}
    diff = paired_difference(before, after)
    assert diff.estimate == pytest.approx(0.25)
    assert diff.low == pytest.approx(0.25) and diff.high == pytest.approx(0.25)
    assert diff.excludes_zero()
    unpaired = task_interval(after)
    assert unpaired.high - unpaired.low > 0.2  # each rate alone is far less certain


def test_paired_difference_includes_zero_without_a_change_and_signs_a_loss() -> None:
    before = {f"t{i}": [i % 3 == 0, i % 2 == 0, True, False] for i in range(10)}
    same = paired_difference(before, before)
    assert same.estimate == 0.0 and not same.excludes_zero()
    worse = {t: [False] * 4 for t in before}
    loss = paired_difference(before, worse)
    assert loss.estimate < 0 and loss.high < 0


def test_paired_difference_uses_shared_tasks_only() -> None:
    diff = paired_difference({"a": [False], "b": [False]}, {"a": [True], "c": [False]})
    assert diff.estimate == 1.0
    with pytest.raises(ValueError, match="share no task"):
        paired_difference({"a": [True]}, {"b": [True]})


def test_task_outcomes_keeps_successes_per_task_and_skips_rejected_episodes() -> None:
    outcomes = TaskOutcomes()
    for task_id, success, outcome in (
        ("sim-001", True, "completed"),
        ("sim-001", False, "completed"),
        ("sim-002", True, "rejected"),
    ):
        record = EpisodeRecord(context=EpisodeContext(task=Task(task_id=task_id)))
        record.success = success
        record.outcome = outcome
        outcomes.episode_finished(record)
    assert outcomes.by_task == {"sim-001": [True, False]}
