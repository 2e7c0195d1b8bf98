"""Backends for the store tests: SQLite always, PostgreSQL from ``CUA_TEST_PG_URL``.

In CI (``CI`` set) a missing ``CUA_TEST_PG_URL`` fails the PostgreSQL tests instead of skipping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from cua_native.monitor.db.schema import Base
from cua_native.monitor.db.store import MonitorStore, make_engine


def _reset_postgres(url: str) -> None:
    engine = make_engine(url)
    try:
        # CASCADE, table by table: a database left by an older schema (other constraint names,
        # other columns) is reset as surely as one at head
        with engine.begin() as connection:
            for table in [*Base.metadata.tables, "alembic_version"]:
                connection.execute(text(f'DROP TABLE IF EXISTS "{table}" CASCADE'))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'monitor.db'}"
    url = os.environ.get("CUA_TEST_PG_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CUA_TEST_PG_URL is not set in CI (source .ci/services.sh)")
        pytest.skip("PostgreSQL tests need CUA_TEST_PG_URL (see .ci/services.sh)")
    _reset_postgres(url)
    return url


@pytest.fixture
def store(db_url: str, tmp_path: Path) -> Iterator[MonitorStore]:
    opened = MonitorStore.open(db_url, run_dir=tmp_path / "run")
    try:
        yield opened
    finally:
        opened.close()
