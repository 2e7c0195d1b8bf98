"""The warm-start tests' demonstration source: the toy phone of ``fakes.toy_phone`` and its
solver (the tiny model: ``tests/conftest.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from fakes.toy_phone import ToyGym, toy_solver


@pytest.fixture
def toy_source() -> Any:
    """A ``DemoSource`` for ``collect_demos``: a fresh ``ToyGym`` (kept in ``.gyms``) and the
    toy solver."""

    class Source:
        def __init__(self) -> None:
            self.gyms: list[ToyGym] = []

        def __call__(self, executor: Any) -> tuple[ToyGym, Any]:
            gym = ToyGym()
            self.gyms.append(gym)
            return gym, toy_solver

    return Source()
