"""Fixtures of the real-desktop tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory for desktops' state, short enough for their Unix sockets' paths (107 bytes):
    pytest's ``tmp_path`` is not once its run number and the test's name grow."""
    path = Path(tempfile.mkdtemp(prefix="cua-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
