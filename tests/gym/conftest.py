"""The server tests' gym (``fakes.counter_gym``) and a uvicorn server on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fakes.counter_gym import CounterGym
from fastapi import FastAPI


@contextlib.asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    """Run ``app`` with uvicorn on 127.0.0.1:<free port> in this loop; yields the base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn exited before starting")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=60)


@pytest.fixture
def toy() -> CounterGym:
    return CounterGym()


@pytest.fixture(name="serve")
def serve_fixture() -> Any:
    """``async with serve(app) as base_url``."""
    return serve
