"""Process set-up for rollouts: allocator settings, switch interval, a CPU pool per core."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from cua_native.rollout.cpu_pool import RankedPool
from cua_native.rollout.runtime import (
    SWITCH_INTERVAL,
    available_cores,
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


FREEZE_CHECK = """
import gc
from cua_native.rollout.runtime import freeze_startup_heap
survivor = [object() for _ in range(10)]
frozen = freeze_startup_heap()
assert frozen == gc.get_freeze_count() > len(survivor), (frozen, gc.get_freeze_count())
assert not any(survivor is obj for obj in gc.get_objects())  # out of every generation
gc.unfreeze()
assert any(survivor is obj for obj in gc.get_objects())
print("ok")
"""


def test_freeze_startup_heap_hides_live_objects_from_the_collector() -> None:
    # the collector's frozen generation is process-wide: checked in a fresh interpreter, where
    # no thread left by another test can collect, freeze or unfreeze in between
    result = subprocess.run(
        [sys.executable, "-c", FREEZE_CHECK], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
