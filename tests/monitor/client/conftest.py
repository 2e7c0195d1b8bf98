"""Makes ``recorder_kit`` importable (pytest runs with ``--import-mode=importlib``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cua_native.monitor.db.store import MonitorStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MonitorStore]:
    opened = MonitorStore.open(None, run_dir=tmp_path / "store")
    yield opened
    opened.close()
