"""Uniform groups (``trajectory.is_uniform_group``, skipped with ``cua.skip_uniform_groups``):
which groups carry no GRPO signal, decided from the episodes' rewards before rows are built;
the workflow gives a skipped group no rows."""

from __future__ import annotations

import torch

from cua_native.rollout.trajectory import discounted, is_uniform_group, normalized_rewards


def _uniform(episode_rewards: list[float], normalize: bool = True) -> bool:
    decided = is_uniform_group(episode_rewards, normalize=normalize, eps=1e-6)
    # the rows' rewards (what the update sees) are all 0 exactly when the group is uniform
    values = normalized_rewards(episode_rewards, 1e-6) if normalize else episode_rewards
    rows = torch.tensor([r for v in values for r in discounted(v, 3, 0.9)])
    assert decided == (not bool(rows.abs().max() > 1e-6))
    return decided


def test_equal_rewards_make_a_uniform_group_even_after_rounding() -> None:
    # 0.1 * 3 / 3 is not 0.1 in floats: the normalised rewards are ~1e-11, not 0
    assert _uniform([0.1, 0.1, 0.1])
    assert _uniform([1.0, 1.0, 1.0, 1.0])
    assert _uniform([-0.1, -0.1, -0.1, -0.1])


def test_any_difference_makes_a_group_not_uniform() -> None:
    assert not _uniform([1.0, 0.0, 0.0, 0.0])
    # a format penalty alone is a difference too (it is kept, as it is trained on)
    assert not _uniform([-0.05, 0.0, 0.0, 0.0])


def test_raw_rewards_are_never_uniform_noise() -> None:
    # without group normalisation equal rewards still move the policy (no baseline)
    assert not _uniform([1.0, 1.0], normalize=False)
    assert _uniform([0.0, 0.0], normalize=False)


def test_mean_only_normalisation() -> None:
    assert is_uniform_group([0.3, 0.3], normalize="mean", eps=1e-6)
    assert not is_uniform_group([0.3, 0.2], normalize="mean", eps=1e-6)
