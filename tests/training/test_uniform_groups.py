"""``cua.skip_uniform_groups``: which groups are uniform (carry no GRPO signal)."""

from __future__ import annotations

import torch

from cua_native.rollout.trajectory import discounted, normalized_rewards
from cua_native.training.embedded.trainer import _is_uniform


def _group(episode_rewards: list[float], turns: int = 3, normalize: bool = True) -> dict:
    values = normalized_rewards(episode_rewards, 1e-6) if normalize else episode_rewards
    rows = [r for v in values for r in discounted(v, turns, 0.9)]
    return {"rewards": torch.tensor(rows, dtype=torch.float32)}


def test_equal_rewards_make_a_uniform_group_even_after_rounding() -> None:
    # 0.1 * 3 / 3 is not 0.1 in floats: the normalised rewards are ~1e-11, not 0
    assert _is_uniform(_group([0.1, 0.1, 0.1]))
    assert _is_uniform(_group([1.0, 1.0, 1.0, 1.0]))
    assert _is_uniform(_group([-0.1, -0.1, -0.1, -0.1]))


def test_any_difference_makes_a_group_not_uniform() -> None:
    assert not _is_uniform(_group([1.0, 0.0, 0.0, 0.0]))
    # a format penalty alone is a difference too (it is kept, as it is trained on)
    assert not _is_uniform(_group([-0.05, 0.0, 0.0, 0.0]))


def test_raw_rewards_are_never_uniform_noise() -> None:
    # without group normalisation equal rewards still move the policy (no baseline)
    assert not _is_uniform(_group([1.0, 1.0], normalize=False))
