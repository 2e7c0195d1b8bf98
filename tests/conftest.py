"""Fixtures every test folder shares: the tiny Qwen3-VL, built once per session the way the
commands build it (``rollout.factories.tiny_model_dir``: the tiny model of
``cua_native.models.tiny`` with a tokenizer trained on the prompts), and its processor.
Nothing is downloaded. Heavy imports happen only when a test asks for these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cua_native.rollout.factories import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def processor(tiny_dir: Path) -> Any:
    from cua_native.rollout.factories import load_processor

    return load_processor(tiny_dir)
