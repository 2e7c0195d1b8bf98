"""Fixtures for the stand-in server: a forward gate, a server thread, AReaL's clients.

``kit`` and ``tiny`` come from ``tests/engine/conftest.py``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from areal.api.cli_args import InferenceEngineConfig

from cua_native.engine import InProcessEngine
from cua_native.engine.serve import ServedModel, build_app

WAIT_S = 60.0


class ForwardGate:
    """Counts the model's forward passes and blocks pass number ``at`` (0 = the first prefill)
    until ``release``. Hooked on the output embedding, which every forward pass runs once."""

    def __init__(self, model: Any, at: int) -> None:
        self.at = at
        self.calls = 0
        self.blocked = threading.Event()
        self._release = threading.Event()
        self._handle = model.get_output_embeddings().register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        index, self.calls = self.calls, self.calls + 1
        if index == self.at:
            self.blocked.set()
            if not self._release.wait(WAIT_S):
                raise RuntimeError("ForwardGate was never released")

    async def wait_blocked(self) -> None:
        if not await asyncio.to_thread(self.blocked.wait, WAIT_S):
            raise TimeoutError("the gated forward pass never started")

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._release.set()
        self._handle.remove()


def abort_spy(engine: InProcessEngine) -> threading.Event:
    """An event set once ``engine.abort_requests`` has been called (the call goes through)."""
    called = threading.Event()
    original = engine.abort_requests

    def spy() -> None:
        original()
        called.set()

    engine.abort_requests = spy  # type: ignore[method-assign]
    return called


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Bounded polling for state another thread changes."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class Serving:
    addr: str
    served: ServedModel

    @property
    def url(self) -> str:
        return f"http://{self.addr}"


@contextmanager
def serving(engine: InProcessEngine, backend: str, name: str = "tiny") -> Iterator[Serving]:
    """The app on a free loopback port, served by uvicorn on a thread."""
    served = ServedModel(engine, name)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(served, backend), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield Serving(addr=f"127.0.0.1:{sock.getsockname()[1]}", served=served)
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


def client_config(backend: str, **overrides: Any) -> InferenceEngineConfig:
    """What ``PPOTrainer`` hands AReaL's remote engine, scaled down for a test."""
    fields: dict[str, Any] = {
        "backend": f"{backend}:d1",
        "experiment_name": "serve-test",
        "trial_name": "trial",
        "max_concurrent_rollouts": 4,
        "consumer_batch_size": 1,
        "setup_timeout": WAIT_S,
        "request_timeout": WAIT_S,
        "request_retries": 1,
        "pause_grace_period": 0.0,
    }
    fields.update(overrides)
    return InferenceEngineConfig(**fields)


@contextmanager
def areal_client(cls: type, addr: str, **overrides: Any) -> Iterator[Any]:
    """AReaL's ``RemoteSGLangEngine``/``RemotevLLMEngine`` attached to ``addr``."""
    backend = "sglang" if "SGLang" in cls.__name__ else "vllm"
    client = cls(client_config(backend, **overrides))
    client.initialize(addr=addr)
    try:
        yield client
    finally:
        client.destroy()


class ServeKit:
    """The helpers above, handed to tests as a fixture (importlib mode cannot import conftest)."""

    ForwardGate = ForwardGate
    abort_spy = staticmethod(abort_spy)
    wait_until = staticmethod(wait_until)
    serving = staticmethod(serving)
    areal_client = staticmethod(areal_client)
    client_config = staticmethod(client_config)


@pytest.fixture(scope="session")
def sk() -> ServeKit:
    return ServeKit()
