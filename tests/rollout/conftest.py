"""Shared fixtures (the tiny model and its processor: ``tests/conftest.py``): the real
in-process engine, a scripted test engine, and a gym wrapper that fails on demand."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.faulty_gym import FaultyGym
from fakes.scripted_engine import ScriptedEngine

from cua_native.actions.models import Action


@pytest.fixture(scope="session")
def inprocess_engine(tiny_dir: Path) -> Iterator[Any]:
    from cua_native.engine import InProcessEngine

    engine = InProcessEngine.from_pretrained(str(tiny_dir), device="cpu", seed=0)
    try:
        yield engine
    finally:
        engine.destroy()


@pytest.fixture
def scripted_engine_factory(processor: Any) -> Callable[..., ScriptedEngine]:
    from cua_native.rollout.factories import stop_token_ids

    def make(dialect: Any, script: Callable[[int], Action | str], latency: float = 0.0):
        tokenizer = processor.tokenizer
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert im_end in stop_token_ids(tokenizer)
        return ScriptedEngine(tokenizer, dialect, script, im_end, latency)

    return make


@pytest.fixture
def faulty_gym_factory() -> Callable[..., FaultyGym]:
    from cua_native.gym.sim import SimGym

    def make(**kwargs: Any) -> FaultyGym:
        return FaultyGym(SimGym(seed=0), **kwargs)

    return make
