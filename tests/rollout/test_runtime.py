"""Process set-up for rollouts: allocator settings, switch interval, a CPU pool per core."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading

import pytest

from cua_native.rollout.cpu_pool import RankedPool
from cua_native.rollout.runtime import (
    SWITCH_INTERVAL,
    available_cores,
    freeze_startup_heap,
    install_cpu_pool,
    tune_allocator,
    tune_for_rollouts,
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_allocator_settings_take_effect_on_glibc() -> None:
    assert tune_allocator() is True


def test_tune_for_rollouts_sets_the_switch_interval() -> None:
    before = sys.getswitchinterval()
    try:
        tune_for_rollouts()
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    finally:
        sys.setswitchinterval(before)


def test_cpu_pool_is_a_ranked_default_executor_with_one_thread_per_core() -> None:
    async def main() -> tuple[set[str], int]:
        pool = install_cpu_pool(asyncio.get_running_loop())
        names = await asyncio.gather(
            *(asyncio.to_thread(lambda: threading.current_thread().name) for _ in range(32))
        )
        assert isinstance(pool, RankedPool)
        return set(names), pool._max_workers

    names, workers = asyncio.run(main())
    assert workers == available_cores() >= 1
    assert names and all(name.startswith("cua-cpu") for name in names)
    assert len(names) <= workers


def test_freeze_startup_heap_hides_live_objects_from_the_collector() -> None:
    survivor = [object() for _ in range(10)]
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > len(survivor)
        assert not any(survivor is obj for obj in gc.get_objects())  # out of every generation
    finally:
        gc.unfreeze()
    assert any(survivor is obj for obj in gc.get_objects())
