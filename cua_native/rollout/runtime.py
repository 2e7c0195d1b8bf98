"""Process set-up for rollout processes: memory reuse, GIL hand-offs, a CPU pool per core, a
frozen start-up heap.

Four process-wide settings, applied by the entry points (``train``, ``evaluate``, the benches)
through ``tune_for_rollouts``, ``install_cpu_pool`` and ``freeze_startup_heap``, never on
import:

**Allocator.** Every turn allocates megabytes that live for a few seconds (pixel tensors,
screenshots, training rows). With glibc's defaults that memory goes back to the system as soon
as it is free and is page-faulted in again by the next turn or batch: blocks over the dynamic
mmap threshold are mapped and unmapped one by one, the main heap's free top is trimmed, and a
worker thread's arena deletes its 64 MiB heaps once they are empty, which happens after every
synchronous batch. On the 2-core CI machine that was most of a turn's CPU (pixel tensors
1.8 ms → 0.5 ms, prompt assembly 1.5 ms → 0.3 ms), and a second 256-episode wave still
re-faulted its 3 GB (3.1 → 1.7 ms of CPU per turn with the settings below, ``bench/perf/loop.py``).

``tune_allocator`` sets, through ``mallopt`` for the running process: blocks up to 32 MiB from
the heap (``M_MMAP_THRESHOLD``), one arena for all threads (``M_ARENA_MAX``: the main heap,
which is only given back by trimming) and no trimming (``M_TRIM_THRESHOLD``). The resident size
then stays at its peak instead of shrinking between batches. Entry points (``train``,
``evaluate``, the benches) call it; processes started by others (AReaL's rollout workers) get
the same through the environment variables in ``ALLOCATOR_ENV``.

**GIL switch interval.** Screenshot and prompt work runs in worker threads; each time one of
them releases the GIL (Pillow, NumPy, tokenizers) a busy event loop may keep it for the whole
switch interval (5 ms by default) before the worker gets it back. 1 ms cut that convoy: 52 % →
63 % of the latency-bound rate at 256 concurrent episodes on one core (``bench/perf/loop.py``).

**CPU pool.** The loop's default executor (``asyncio.to_thread``, ``run_in_executor(None)``)
gets one thread per available core instead of ``cores + 4``: more threads than cores only
contend for the GIL, and with one core the event-loop lag p99 fell from 78 ms to 10 ms. It
serves the episode furthest behind first (``cpu_pool.RankedPool``).

**Frozen start-up heap.** After imports and model loading a process holds ~700k objects the
cyclic garbage collector can track (modules, classes, the tokenizer, the model's modules) that
live as long as the process. Every full collection walked all of them: 0.45 s with the event
loop stopped, once per 256-episode batch (``bench/perf/loop.py``). ``freeze_startup_heap`` moves them
out of the collector's sight (``gc.freeze``) once loading is done; objects created later are
collected as before.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from cua_native.rollout.cpu_pool import RankedPool

T = TypeVar("T")

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

MMAP_THRESHOLD = 32 * 2**20
"""Blocks below this come from the heap (glibc's maximum for the setting is 32 MiB on 64-bit)."""
SWITCH_INTERVAL = 0.001
"""Seconds a thread may hold the GIL while another waits (CPython's default is 0.005)."""
NEVER_TRIM = 2**64 - 1
"""glibc trims the heap when its free top exceeds the threshold: this one is never reached."""

ALLOCATOR_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(NEVER_TRIM),
    "MALLOC_ARENA_MAX": "1",
}
"""The same settings for processes started with an environment (glibc reads them at start)."""


def tune_allocator() -> bool:
    """Apply ``ALLOCATOR_ENV``'s settings to this process's glibc allocator (threads that
    already have an arena keep it; call before starting pools).

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
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, -1),  # mallopt takes an int: -1 is (size_t)-1, NEVER_TRIM
        (_M_ARENA_MAX, 1),
    )
    applied = all([bool(mallopt(option, value)) for option, value in settings])
    if not applied:
        logger.info("mallopt refused the allocator settings; running with the defaults")
    return applied


def tune_for_rollouts() -> None:
    """``tune_allocator`` and the GIL switch interval (see the module docstring)."""
    tune_allocator()
    sys.setswitchinterval(SWITCH_INTERVAL)


def freeze_startup_heap() -> int:
    """Collect once, then exclude every object alive now from future collections (see the
    module docstring). Call after loading, before the rollouts. Returns the objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under ``taskset`` or a cgroup)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def install_cpu_pool(loop: asyncio.AbstractEventLoop, workers: int | None = None) -> RankedPool:
    """Make ``loop``'s default executor a ``RankedPool`` of ``workers`` threads (default:
    one per available core). ``asyncio.run`` shuts it down with the loop."""
    pool = RankedPool(max_workers=workers or available_cores(), thread_name_prefix="cua-cpu")
    loop.set_default_executor(pool)
    return pool


async def with_cpu_pool(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(with_cpu_pool(main()))``: run ``main`` with ``install_cpu_pool``."""
    install_cpu_pool(asyncio.get_running_loop())
    return await main
