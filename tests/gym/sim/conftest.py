"""Shared fixtures: a full-size simulator and a small one (same layout, cheaper frames)."""

from __future__ import annotations

import pytest

from cua_native.gym.sim import SimGym


@pytest.fixture
def gym() -> SimGym:
    return SimGym(seed=0)


@pytest.fixture
def small_gym() -> SimGym:
    return SimGym(seed=0, width=270, height=600)
