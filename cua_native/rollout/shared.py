"""One set of heavy workflow resources per process, shared by AReaL's workflow objects.

AReaL builds a new ``CUAAgentWorkflow`` from its import path and ``workflow_kwargs`` for every
task (or batch). Each used to load the processor, open its own gym client and start a recorder
(two threads), and none was closed: a rollout worker's threads grew 4 → 6 → 8 → 10.
``SharedResources`` keeps ONE set per (event loop, serialized config, observer factory) and
hands it to every workflow object that asks; it is closed when its loop's owner calls
``aclose`` or, at the latest, at process exit (``atexit``: observers are closed from any
thread; gym clients on their loop when it still runs).

``PROCESS_RESOURCES`` is the process's registry: the one deliberate piece of module state,
because AReaL gives workflow objects nothing else they could share.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 30.0


class SharedResources:
    """Resources created once per key and event loop; ``get`` is safe under concurrency
    (concurrent callers await the same creation; a failed creation is retried next time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[
            tuple[int, Hashable], tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]
        ] = {}

    async def get(self, key: Hashable, create: Callable[[], Awaitable[Any]]) -> Any:
        loop = asyncio.get_running_loop()
        slot = (id(loop), key)
        with self._lock:
            entry = self._entries.get(slot)
            if entry is None or entry[0] is not loop:
                task: asyncio.Task[Any] = loop.create_task(_awaited(create()))
                entry = self._entries[slot] = (loop, task)
        try:
            return await asyncio.shield(entry[1])
        except Exception:
            with self._lock:
                if self._entries.get(slot) is entry:
                    del self._entries[slot]
            raise

    def __len__(self) -> int:
        return len(self._entries)

    async def aclose(self) -> None:
        """Close every set created on the running loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = [k for k, (owner, _) in self._entries.items() if owner is loop]
            entries = [self._entries.pop(k) for k in mine]
        for _, task in entries:
            if task.done() and task.exception() is None:
                await task.result().aclose()

    def close_all(self) -> None:
        """From any thread (process exit): close each set on its loop if that loop still runs,
        else only what needs no loop."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for loop, task in entries:
            if not task.done() or task.exception() is not None:
                continue
            resources = task.result()
            if loop.is_running() and not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(resources.aclose(), loop)
                with contextlib.suppress(concurrent.futures.TimeoutError, Exception):
                    future.result(CLOSE_TIMEOUT_S)
            else:
                with contextlib.suppress(Exception):
                    resources.close_sync()


PROCESS_RESOURCES = SharedResources()
atexit.register(PROCESS_RESOURCES.close_all)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    """``create_task`` takes a coroutine; ``create`` may return any awaitable."""
    return await awaitable
