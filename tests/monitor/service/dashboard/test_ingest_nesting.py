"""Deeply nested JSON sent to a real ingest server (uvicorn on loopback): one 422 line, nothing
written, the server goes on answering. The parser's recursion limit and the contract's depth
limit (``ingest.MAX_DEPTH``) both end in that answer, never a 500 or a reset connection."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import func, select

from cua_native.monitor.db.schema import Training
from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.ingest import MAX_DEPTH
from cua_native.monitor.service.dashboard.app import create_app

TOKEN = "nesting-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MonitorStore]:
    opened = MonitorStore.open(None, run_dir=tmp_path)
    yield opened
    opened.close()


@pytest.fixture
def base_url(store: MonitorStore) -> Iterator[str]:
    config = uvicorn.Config(
        create_app(store, token=TOKEN), host="127.0.0.1", port=0, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(12_000):  # bounded, generous under load (~2 min); binds in a few ms
            if server.started:
                break
            thread.join(0.01)
        assert server.started, "ingest server did not start"
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def _nested(depth: int) -> str:
    """A JSON value of ``depth`` nested arrays around an object: ``[[...{"k": 1}...]]``."""
    return "[" * depth + '{"k": 1}' + "]" * depth


def _training(name: str, config_json: str) -> str:
    return f'{{"training": {{"run_name": "{name}", "config_json": {config_json}}}}}'


def _trainings(store: MonitorStore) -> int:
    with store.session() as session:
        return int(session.scalar(select(func.count()).select_from(Training)) or 0)


@pytest.mark.parametrize(
    "body",
    [
        _nested(100_000),  # beyond the parser's recursion limit, at the top level
        _training("deep-parser", _nested(5_000)),  # beyond it, inside a record
        _training("deep-walk", _nested(900)),  # parsed, then deeper than any walk may go
        _training("deep-contract", _nested(MAX_DEPTH - 1)),  # one level over the contract
    ],
    ids=["top-100000", "record-5000", "record-900", "record-limit+1"],
)
def test_deep_nesting_is_one_422_line_and_nothing_is_written(
    base_url: str, store: MonitorStore, body: str
) -> None:
    with httpx.Client(base_url=base_url, headers=AUTH, timeout=60) as client:
        answer = client.post("/api/ingest/batch", content=body)
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert "nest" in error and f"{MAX_DEPTH} levels" in error and "\n" not in error
        assert _trainings(store) == 0
        # the same connection goes on: the server neither crashed nor reset it
        fine = client.post("/api/ingest/batch", content=_training("fine", _nested(3)))
        assert fine.status_code == 200 and isinstance(fine.json()["training_id"], int)
    assert _trainings(store) == 1


def test_values_up_to_the_limit_are_kept(base_url: str, store: MonitorStore) -> None:
    """A record of ``MAX_DEPTH`` levels passes: the record, ``MAX_DEPTH - 2`` arrays and the
    object inside them."""
    body = _training("at-limit", _nested(MAX_DEPTH - 2))
    answer = httpx.post(f"{base_url}/api/ingest/batch", content=body, headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text
    assert _trainings(store) == 1
