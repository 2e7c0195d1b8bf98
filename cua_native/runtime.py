"""Process set-up for rollout processes: memory reuse, GIL hand-offs, a CPU pool per core.

Three process-wide settings, applied by the entry points (``train``, ``evaluate``, the benches)
through ``tune_for_rollouts`` and ``install_cpu_pool``, never on import:

**Allocator.** Every turn allocates megabytes that live for a few seconds (pixel tensors, their per-prompt
concatenation, screenshots). With glibc's defaults, blocks over the dynamic mmap threshold are
mapped and unmapped one by one and freed heap tops are trimmed, so each new buffer page-faults
its memory in again; on the 2-core CI machine that was most of a turn's CPU (pixel tensors
1.8 ms → 0.5 ms, prompt assembly 1.5 ms → 0.3 ms with the settings below, ``bench/loop.py``).

``tune_allocator`` sets the equivalent of ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
through ``mallopt`` for the running process; the resident size then stays near its peak rather
than shrinking between steps. Entry points (``train``, ``evaluate``, the benches) call it;
processes started by others (AReaL's rollout workers) get the same through the environment
variables in ``ALLOCATOR_ENV``.

**GIL switch interval.** Screenshot and prompt work runs in worker threads; each time one of
them releases the GIL (Pillow, NumPy, tokenizers) a busy event loop may keep it for the whole
switch interval (5 ms by default) before the worker gets it back. 1 ms cut that convoy: 52 % →
63 % of the latency-bound rate at 256 concurrent episodes on one core (``bench/loop.py``).

**CPU pool.** The loop's default executor (``asyncio.to_thread``, ``run_in_executor(None)``)
gets one thread per available core instead of ``cores + 4``: more threads than cores only
contend for the GIL, and with one core the event-loop lag p99 fell from 78 ms to 10 ms.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 * 2**20
"""Blocks below this come from the heap (glibc's maximum for the setting is 32 MiB on 64-bit)."""
SWITCH_INTERVAL = 0.001
"""Seconds a thread may hold the GIL while another waits (CPython's default is 0.005)."""
TRIM_THRESHOLD = 1 * 2**30
"""Free memory at the heap top kept for reuse before it is returned to the system."""

ALLOCATOR_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
}
"""The same settings for processes started with an environment (glibc reads them at start)."""


def tune_allocator() -> bool:
    """Apply ``MMAP_THRESHOLD`` and ``TRIM_THRESHOLD`` to this process's glibc allocator.

    Returns whether they took effect (``False`` off Linux/glibc, e.g. musl or macOS, where
    nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not applied:
        logger.info("mallopt refused the allocator settings; running with the defaults")
    return applied


def tune_for_rollouts() -> None:
    """``tune_allocator`` and the GIL switch interval (see the module docstring)."""
    tune_allocator()
    sys.setswitchinterval(SWITCH_INTERVAL)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under ``taskset`` or a cgroup)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def install_cpu_pool(
    loop: asyncio.AbstractEventLoop, workers: int | None = None
) -> ThreadPoolExecutor:
    """Make ``loop``'s default executor a pool of ``workers`` threads (default: one per
    available core). ``asyncio.run`` shuts it down with the loop."""
    pool = ThreadPoolExecutor(
        max_workers=workers or available_cores(), thread_name_prefix="cua-cpu"
    )
    loop.set_default_executor(pool)
    return pool


async def with_cpu_pool(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(with_cpu_pool(main()))``: run ``main`` with ``install_cpu_pool``."""
    install_cpu_pool(asyncio.get_running_loop())
    return await main
