"""One set of heavy workflow resources per process
(docs/contracts.md#per-process-resources).

AReaL builds a ``CUAAgentWorkflow`` from its import path and kwargs for every task. 100 such
objects (as 100 tasks would create them) must share one processor, one gym client and one
recorder: the thread count stays flat, and closing the set releases the recorder's thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from cua_native.rollout.config import AgentConfig
from cua_native.rollout.shared import PROCESS_RESOURCES
from cua_native.rollout.workflow import CUAAgentWorkflow, workflow_kwargs

WORKER_OBSERVER = "cua_native.monitor.client.worker.observer_from_env"


def test_100_workflow_objects_share_one_set(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUA_MONITOR_DB", "sqlite")
    monkeypatch.setenv("CUA_RUN_DIR", str(tmp_path))
    config = AgentConfig(
        model_path=str(tiny_dir), gym={"kind": "http", "base_url": "http://127.0.0.1:9"}
    )
    kwargs = workflow_kwargs(config, source="step", observer_factory=WORKER_OBSERVER)

    async def main() -> tuple[list[int], int, int]:
        counts, seen = [], set()
        for _ in range(100):
            workflow = CUAAgentWorkflow(**kwargs)  # what AReaL does per task
            resources = await workflow._resources()
            seen.add(id(resources))
            counts.append(threading.active_count())
        before_close = threading.active_count()
        await PROCESS_RESOURCES.aclose()
        return counts, len(seen), threading.active_count() - before_close

    counts, distinct, released = asyncio.run(main())
    assert distinct == 1
    assert counts[-1] == counts[0], counts  # flat from the first task on
    assert released < 0  # the recorder's thread went with the set
