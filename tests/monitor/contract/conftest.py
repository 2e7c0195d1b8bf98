"""A real ``cua_native.monitor`` ingest server (uvicorn on loopback, its own thread) for the
existing monitor client, which is synchronous (``urllib``)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.service.dashboard.app import create_app

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # contract_kit
sys.path.insert(0, str(HERE.parent / "client"))  # recorder_kit
sys.path.insert(0, str(HERE / "vendored"))  # the existing client, as the package ``cua_rl``

from contract_kit import TOKEN  # noqa: E402


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MonitorStore]:
    opened = MonitorStore.open(None, run_dir=tmp_path / "server")
    yield opened
    opened.close()


@pytest.fixture
def server(store: MonitorStore) -> Iterator[str]:
    config = uvicorn.Config(
        create_app(store, token=TOKEN), host="127.0.0.1", port=0, log_level="warning"
    )
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        for _ in range(12_000):  # bounded, generous under load (~2 min); binds in a few ms
            if running.started:
                break
            thread.join(0.01)
        assert running.started, "ingest server did not start"
        port = running.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        running.should_exit = True
        thread.join(30)
