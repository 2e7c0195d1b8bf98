"""Deterministic hypothesis profile and shared helpers for the action-dialect tests.

Also puts ``upstream/`` (the vendored upstream parsers) on ``sys.path``: pytest runs with
``--import-mode=importlib``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile(
    "cua_actions", derandomize=True, max_examples=1000, deadline=None, database=None
)
settings.load_profile("cua_actions")
sys.path.insert(0, str(Path(__file__).parent / "upstream"))

POINT_FIELDS = ("x", "y", "x2", "y2")


def same_action(wanted: dict[str, Any], got: dict[str, Any], step: float) -> bool:
    """Canonical JSON equality with points compared within ``step``."""
    if wanted.keys() != got.keys():
        return False
    for key, value in wanted.items():
        other = got[key]
        if key in POINT_FIELDS and value is not None and other is not None:
            if abs(value - other) > step + 1e-9:
                return False
        elif value != other:
            return False
    return True


@pytest.fixture(name="same_action", scope="session")
def same_action_fixture() -> object:
    return same_action
