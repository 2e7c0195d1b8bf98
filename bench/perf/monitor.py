"""Monitor recorder figures: cost of a recorder call on the rollout's event loop and sustained
write rate into SQLite (and PostgreSQL when ``CUA_TEST_PG_URL`` is set) with many concurrent
simulated rollouts.

    uv run python bench/perf/monitor.py [--rollouts 256] [--turns 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image

from cua_native.actions.errors import ParsedOutput
from cua_native.actions.models import Click, Terminate
from cua_native.gym.protocol import Evaluation, Observation, Screenshot, StepResult, Task
from cua_native.monitor.client.recorder import Recorder
from cua_native.monitor.client.sinks import SqlSink
from cua_native.monitor.db.store import MonitorStore
from cua_native.rollout.records import EndReason, EpisodeContext, EpisodeRecord, TurnRecord


def turn(index: int, shot: Screenshot, after: Screenshot) -> TurnRecord:
    return TurnRecord(
        index=index,
        observation=Observation(shot, 540, 1200, index),
        prompt_ids=list(range(2000)),
        output_ids=list(range(120)),
        output_logprobs=[-0.5] * 120,
        output_versions=[0] * 120,
        text="<thinking>tap</thinking><tool_call>...</tool_call>",
        parsed=ParsedOutput(action=Click(x=0.5, y=0.5), thought="tap"),
        step=StepResult(ok=True, observation=Observation(after, 540, 1200, index + 1)),
        timings={"generate": 0.4, "act": 0.1},
    )


async def rollout(
    recorder: Recorder, n: int, turns: int, shots: list[Screenshot], costs: list[float]
) -> None:
    context = EpisodeContext(task=Task(task_id=f"task-{n % 32}", name="t"), step=0)
    timed = time.perf_counter
    start = timed()
    recorder.episode_started(context)
    costs.append(timed() - start)
    records = []
    for i in range(turns):
        await asyncio.sleep(0)  # other rollouts run in between, as with a real engine
        record = turn(i, shots[(n + i) % len(shots)], shots[(n + i + 1) % len(shots)])
        records.append(record)
        start = timed()
        recorder.turn_finished(context, record)
        costs.append(timed() - start)
    records[-1].parsed = ParsedOutput(action=Terminate(status="success"))
    end = EpisodeRecord(
        context,
        records,
        evaluation=Evaluation(1.0, True),
        reward=1.0,
        success=True,
        end_reason=EndReason.TERMINATE,
    )
    start = timed()
    recorder.episode_finished(end)
    costs.append(timed() - start)


async def bench(label: str, url: str | None, run_dir: Path, rollouts: int, turns: int) -> None:
    store = MonitorStore.open(url, run_dir=run_dir)
    shots = [
        Screenshot(image=Image.new("RGB", (540, 1200), (i * 9 % 255, 80, 160))) for i in range(24)
    ]
    recorder = Recorder(
        [SqlSink(store)], run_dir=run_dir, run_name=f"bench-{time.time_ns()}", model_path="bench"
    )
    costs: list[float] = []
    began = time.perf_counter()
    async with recorder:
        recorder.training_started(model_name="bench")
        recorder.step_started(0)
        await asyncio.gather(*(rollout(recorder, n, turns, shots, costs) for n in range(rollouts)))
        produced = time.perf_counter() - began
    elapsed = time.perf_counter() - began
    stats = recorder.stats()
    costs_us = sorted(c * 1e6 for c in costs)
    p99 = costs_us[int(len(costs_us) * 0.99) - 1]
    delivered = stats["monitor/sql/delivered"]
    print(
        f"[{label}] {rollouts} rollouts x {turns} turns: recorder call p50 "
        f"{statistics.median(costs_us):.1f} us, p99 {p99:.1f} us, max {costs_us[-1]:.0f} us"
    )
    print(
        f"[{label}] {stats['monitor/queued']} rows queued ({delivered} after coalescing) "
        f"delivered in {elapsed:.2f} s (recording took {produced:.2f} s): "
        f"{stats['monitor/queued'] / elapsed:.0f} rows/s, {delivered / elapsed:.0f} records/s; "
        f"dropped {stats['monitor/dropped']}, rejected {stats['monitor/sql/rejected']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(bench("sqlite", None, Path(tmp) / "sqlite", args.rollouts, args.turns))
        pg = os.environ.get("CUA_TEST_PG_URL")
        if pg:
            asyncio.run(bench("postgresql", pg, Path(tmp) / "pg", args.rollouts, args.turns))
        else:
            print("[postgresql] skipped: CUA_TEST_PG_URL is not set")


if __name__ == "__main__":
    main()
