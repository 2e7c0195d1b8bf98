"""Recorder cost per turn inside an episode, side by side in one run.

Real episodes (``rollout.episode.run_episode``): the embedded SimGym, the tiny model in the
in-process engine on CPU, ``--concurrency`` episodes at a time. Rounds alternate three observers
on the same tasks, so load drifts hit all three alike:

* ``none``: a no-op observer (the turn's own time);
* ``recorder, no-op sink``: the ``Recorder`` with a sink that accepts every batch (all the
  recorder's own work: rows, PNG data URIs, batching, parent ids; no database);
* ``recorder -> SQLite``: the ``Recorder`` with ``SqlSink`` into a ``MonitorStore`` in the run
  dir (what ``evaluate`` and the embedded trainer use by default).

Per observer: wall ms per turn (episode wall time over turns), the event-loop thread's CPU ms per
turn (work done on the loop: the recorder's hooks and its writer task; the model runs in a
worker thread), the time inside the synchronous hooks per turn (``episode_started`` /
``turn_finished`` / ``episode_finished``), and each as a ratio to ``none``. The close (final
delivery) is outside the measured rounds.

    uv run python bench/perf/recorder.py [--episodes 8] [--concurrency 4] [--turns 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cua_native.config import load_config
from cua_native.monitor.client.recorder import Recorder
from cua_native.monitor.client.sinks import SqlSink, destination_id
from cua_native.monitor.db.store import MonitorStore
from cua_native.rollout.episode import run_episode
from cua_native.rollout.factories import (
    load_engine,
    load_processor,
    make_agent,
    make_gym,
    tiny_model_dir,
)
from cua_native.rollout.records import (
    EpisodeContext,
    EpisodeObserver,
    EpisodeRecord,
    NullObserver,
    TurnRecord,
)


class NoOpSink:
    """Accepts every batch and answers ids as a store would (nothing is written)."""

    accepts_client_refs = True
    contract_only = False

    def __init__(self) -> None:
        self.name = "noop"
        self.address = "noop://"
        self.destination = destination_id("noop", self.address)
        self._next = 0

    async def send(self, batch: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = {}
        for kind, records in batch.items():
            if kind == "training":
                answer["training_id"] = 1
                continue
            mapped = []
            for record in records:
                self._next += 1
                mapped.append({"client_id": record.get("client_id"), "id": self._next})
            answer[kind] = mapped
        return answer

    async def aclose(self) -> None:
        return None


class TimedObserver:
    """Times the synchronous hooks of the observer it wraps."""

    def __init__(self, inner: EpisodeObserver) -> None:
        self.inner = inner
        self.seconds = 0.0

    def episode_started(self, context: EpisodeContext) -> None:
        began = time.perf_counter()
        self.inner.episode_started(context)
        self.seconds += time.perf_counter() - began

    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None:
        began = time.perf_counter()
        self.inner.turn_finished(context, turn)
        self.seconds += time.perf_counter() - began

    def episode_finished(self, record: EpisodeRecord) -> None:
        began = time.perf_counter()
        self.inner.episode_finished(record)
        self.seconds += time.perf_counter() - began


class Measured:
    def __init__(self) -> None:
        self.wall: list[float] = []
        """ms per turn, one value per round."""
        self.loop_cpu: list[float] = []
        self.hooks: list[float] = []


async def main_async(args: argparse.Namespace) -> None:
    config = load_config(None).cua.agent
    config = config.model_copy(update={"max_turns": args.turns})
    model_dir = await asyncio.to_thread(tiny_model_dir)
    processor = await asyncio.to_thread(load_processor, model_dir)
    agent = make_agent(config, processor)
    engine = await load_engine(model_dir, seed=0)
    gym = make_gym(config.gym)
    tasks = await gym.list_tasks()
    modes = ("none", "recorder, no-op sink", "recorder -> SQLite")
    results = {mode: Measured() for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        store = MonitorStore.open(None, run_dir=Path(tmp) / "sqlite")
        recorders = {
            "recorder, no-op sink": Recorder(
                [NoOpSink()], run_dir=Path(tmp) / "noop", run_name="bench-noop", model_path="tiny"
            ),
            "recorder -> SQLite": Recorder(
                [SqlSink(store)], run_dir=Path(tmp) / "sqlite", run_name="bench", model_path="tiny"
            ),
        }
        for recorder in recorders.values():
            await recorder.start()
            recorder.training_started(model_name="tiny")
            recorder.step_started(0)
        try:
            for round_index in range(args.rounds + 1):  # round 0 warms up
                for mode in modes:
                    inner = recorders.get(mode) or NullObserver()
                    observer = TimedObserver(inner)
                    began, loop_began = time.perf_counter(), time.thread_time()
                    turns = await run_round(args, gym, tasks, engine, agent, observer)
                    wall = time.perf_counter() - began
                    loop_cpu = time.thread_time() - loop_began
                    if round_index == 0:
                        continue
                    measured = results[mode]
                    measured.wall.append(1000 * wall / turns)
                    measured.loop_cpu.append(1000 * loop_cpu / turns)
                    measured.hooks.append(1e6 * observer.seconds / turns)
        finally:
            for recorder in recorders.values():
                recorder.training_finished()
                await recorder.aclose()
            await gym.aclose()
        delivered = recorders["recorder -> SQLite"].stats()
    report(args, results, delivered)


async def run_round(
    args: argparse.Namespace,
    gym: Any,
    tasks: list[Any],
    engine: Any,
    agent: Any,
    observer: EpisodeObserver,
) -> int:
    gate = asyncio.Semaphore(args.concurrency)

    async def one(index: int) -> int:
        async with gate:
            task = tasks[index % len(tasks)]
            context = EpisodeContext(task=task, group_id=f"g{index}", step=0)
            run = await run_episode(
                gym=gym, task=task, engine=engine, agent=agent, context=context, observer=observer
            )
            return len(run.record.turns)

    return sum(await asyncio.gather(*(one(i) for i in range(args.episodes))))


def report(args: argparse.Namespace, results: dict[str, Measured], stats: dict[str, int]) -> None:
    base = results["none"]
    base_wall, base_cpu = statistics.median(base.wall), statistics.median(base.loop_cpu)
    print(
        f"{args.episodes} episodes x {args.turns} turns, {args.concurrency} at a time, "
        f"{args.rounds} rounds (medians); SimGym + tiny model, in-process engine on CPU"
    )
    print(
        f"{'observer':<24}{'wall ms/turn':>14}{'x none':>8}{'loop CPU ms/turn':>18}"
        f"{'x none':>8}{'hooks us/turn':>15}{'hooks/turn time':>17}"
    )
    for mode, measured in results.items():
        wall = statistics.median(measured.wall)
        cpu = statistics.median(measured.loop_cpu)
        hooks = statistics.median(measured.hooks)
        print(
            f"{mode:<24}{wall:>14.1f}{wall / base_wall:>8.3f}{cpu:>18.2f}{cpu / base_cpu:>8.3f}"
            f"{hooks:>15.1f}{hooks / (1000 * base_wall):>17.2%}"
        )
    print(
        f"SQLite sink: {stats.get('monitor/queued', 0)} rows queued, "
        f"{stats.get('monitor/sql/delivered', 0)} delivered, "
        f"{stats.get('monitor/sql/rejected', 0)} rejected, {stats.get('monitor/dropped', 0)} dropped"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
