"""An ASGI app served for a test: uvicorn on a thread, on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_app(app: Any, wait_s: float = 60.0) -> Iterator[tuple[str, int]]:
    """``app`` on a free loopback port until the block ends; yields ``(host, port)`` once the
    server has started (polled, bounded by ``wait_s``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + wait_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield "127.0.0.1", sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(wait_s)
        sock.close()
