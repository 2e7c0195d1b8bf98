"""Loop throughput: N concurrent episodes of the production workflow against a fixed-latency
engine, on the SimGym, on as many cores as you give it.

Each episode is ``CUAAgentWorkflow.arun_episode``'s, in groups of the config's ``group_size``:
create, observe, prompt, generate, parse, act, …, evaluate, close, and the group's AReaL training
rows. The engine is a real ``agenerate`` without a model: it sleeps ``--latency`` seconds, then
answers a valid MAI-UI click as token ids (as a remote engine would, it never reads the request's
pixel tensors). Two ways to have N episodes in flight, both against the latency-bound ideal
``N / (turns × latency)`` episodes/s:

* **wave**: N episodes start together; the row ends when the last one finishes (one synchronous
  rollout batch). The episodes' turns stay bunched: in every round all N episodes' CPU work
  queues on the same core, so the last episode finishes about ``N × CPU per turn`` (plus the
  last groups' training rows) after the ideal.
* **sustained**: N episodes in flight at all times, a new group started as soon as one finishes
  (AReaL's asynchronous rollout with ``max_concurrent_rollouts = N``); episodes/s counted over
  a window after a warm-up, when the start-up burst has spread out.

Also printed: the event-loop lag (a 10 ms ticker's scheduling delay, p50/p99), process CPU and
minor page faults per turn (at small N the CPU column is mostly the ticker and idle wake-ups
spread over few turns), peak RSS and the event-loop thread's share of a core. The first two
rows ("cold 1", "cold 2") are waves at the largest size: a process's first batches, which grow
the heap to its peak (page faults) and fill the caches; the rows after them are warm.

    uv run python bench/perf/loop.py [--cores 1] [--latency 1.0] [--turns 4] [--sizes 1,4,16,64,256]
                                [--mode both|wave|sustained] [--window 12] [--pool ranked|fifo]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.actions.dialects import get_dialect
from cua_native.actions.models import Click
from cua_native.config import load_config
from cua_native.gym.protocol import Task
from cua_native.gym.sim.gym import parse_size
from cua_native.rollout.config import AgentConfig
from cua_native.rollout.factories import load_processor, make_agent, make_gym, tiny_model_dir
from cua_native.rollout.runtime import (
    available_cores,
    freeze_startup_heap,
    install_cpu_pool,
    tune_for_rollouts,
)
from cua_native.rollout.workflow import CUAAgentWorkflow


class FixedLatencyEngine:
    """Answers every request after ``latency`` seconds with the same formatted click."""

    def __init__(self, tokenizer: Any, text: str, stop_id: int, latency: float) -> None:
        self.output = [*tokenizer.encode(text, add_special_tokens=False), stop_id]
        self.latency = latency
        self.answered: list[float] = []
        """When each answer was given (``time.perf_counter``)."""

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        await asyncio.sleep(self.latency)
        self.answered.append(time.perf_counter())
        n = len(self.output)
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=list(self.output),
            output_logprobs=[-0.5] * n,
            output_versions=[0] * n,
            stop_reason="stop",
        )


@dataclass
class Probe:
    """Event-loop lag, CPU and wall time over one measured stretch."""

    lags: list[float]
    turns: int = 0
    """Turns answered in the stretch (0: count them from the episodes)."""
    wall: float = 0.0
    cpu: float = 0.0
    loop_cpu: float = 0.0
    faults: int = 0
    """Minor page faults (memory the process touched for the first time, or again after
    giving it back)."""


class Measure:
    def __init__(self) -> None:
        self.probe = Probe(lags=[])
        self._stop = asyncio.Event()

    async def __aenter__(self) -> Probe:
        self._ticker = asyncio.create_task(_ticker(self.probe.lags, self._stop))
        self._cpu, self._loop_cpu = time.process_time(), time.thread_time()
        self._faults = _minor_faults()
        self._start = time.perf_counter()
        return self.probe

    async def __aexit__(self, *exc: object) -> None:
        self.probe.wall = time.perf_counter() - self._start
        self.probe.cpu = time.process_time() - self._cpu
        self.probe.loop_cpu = time.thread_time() - self._loop_cpu
        self.probe.faults = _minor_faults() - self._faults
        self._stop.set()
        await self._ticker


async def _ticker(lags: list[float], stop: asyncio.Event, period: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        expected = loop.time() + period
        await asyncio.sleep(period)
        lags.append(max(0.0, loop.time() - expected))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Bench:
    def __init__(self, config: AgentConfig, latency: float) -> None:
        self.config = config
        self.latency = latency
        self.turns = config.max_turns

    async def setup(self) -> None:
        model_dir = await asyncio.to_thread(tiny_model_dir)
        self.processor = await asyncio.to_thread(load_processor, model_dir)
        agent = make_agent(self.config, self.processor)
        self.max_pixels = agent.builder.sizing.max_pixels
        text = get_dialect("mai_ui").format(Click(x=0.5, y=0.5), thought="tap the middle")
        stop_id = agent.gconfig.stop_token_ids[-1]
        self.engine = FixedLatencyEngine(agent.tokenizer, text, stop_id, self.latency)
        self.gym = make_gym(self.config.gym)
        self.tasks: list[Task] = await self.gym.list_tasks()
        self.workflows = {
            size: CUAAgentWorkflow(
                self.config.model_copy(update={"group_size": size}),
                gym=self.gym,
                processor=self.processor,
            )
            for size in {1, self.config.group_size}
        }
        # Everything loaded so far lives as long as the process (see cua_native.rollout.runtime).
        freeze_startup_heap()

    def _group(self, n: int) -> int:
        size = self.config.group_size
        return size if n % size == 0 else 1

    async def _run_group(self, index: int, group: int) -> int:
        task = self.tasks[index % len(self.tasks)]
        samples = await self.workflows[group].arun_episode(
            self.engine, {"task": task.model_dump_json()}
        )
        if samples is None:
            raise RuntimeError(f"a group of {task.task_id} was rejected (see the log)")
        return group

    async def wave(self, n: int) -> tuple[Probe, float]:
        group = self._group(n)
        async with Measure() as probe:
            done = await asyncio.gather(*(self._run_group(i, group) for i in range(n // group)))
        self.engine.answered.clear()
        return probe, float(sum(done))

    async def sustained(self, n: int, window: float) -> tuple[Probe, float]:
        """Keep ``n`` episodes in flight for a warm-up of one and a half episode lengths plus
        ``window`` seconds. The rate is ``n`` / the mean duration of the groups that started
        and finished inside the window (each lane always has one group running, so this is
        episodes/s without the quantisation of counting whole episodes in a short window);
        CPU per turn is the window's CPU over the turns answered in it."""
        group = self._group(n)
        counter = iter(range(10**9))
        spans: list[tuple[float, float]] = []

        async def lane() -> None:
            while True:
                began = time.perf_counter()
                await self._run_group(next(counter), group)
                spans.append((began, time.perf_counter()))

        lanes = [asyncio.create_task(lane()) for _ in range(n // group)]
        try:
            await asyncio.sleep(1.5 * self.turns * self.latency)
            start = time.perf_counter()
            async with Measure() as probe:
                await asyncio.sleep(window)
            end = start + probe.wall
        finally:
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
        inside = [b - a for a, b in spans if a >= start and b <= end]
        if not inside:
            raise RuntimeError(f"no group ran inside the {window:.0f}s window: make it longer")
        answered = self.engine.answered
        probe.turns = sum(1 for t in answered if start <= t < end)
        answered.clear()
        return probe, n / statistics.mean(inside) * probe.wall

    def row(self, label: str, n: int, probe: Probe, episodes: float) -> str:
        rate = episodes / probe.wall
        ideal = n / (self.turns * self.latency)
        turns = max(1.0, probe.turns or episodes * self.turns)
        return (
            f"{label:>10} {n:>5} {rate:>8.2f} {ideal:>8.2f} {100 * rate / ideal:>7.1f}% "
            f"{1000 * statistics.median(probe.lags or [0.0]):>10.1f} "
            f"{1000 * _percentile(probe.lags, 0.99):>10.1f} {1000 * probe.cpu / turns:>12.2f} "
            f"{probe.faults / turns:>12.0f} {_peak_rss_mib():>13.0f} "
            f"{100 * probe.loop_cpu / probe.wall:>9.0f}%"
        )


async def bench(
    sizes: list[int],
    latency: float,
    config: AgentConfig,
    modes: list[str],
    window: float,
    pool: str,
) -> None:
    loop = asyncio.get_running_loop()
    if pool == "fifo":
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=available_cores(), thread_name_prefix="cua-cpu")
        )
    else:
        install_cpu_pool(loop)
    runner = Bench(config, latency)
    await runner.setup()
    print(
        f"latency {latency:.3f}s/turn, {runner.turns} turns/episode, groups of "
        f"{config.group_size}, tiny processor (max_pixels {runner.max_pixels}), SimGym "
        f"(screenshot_size {config.gym.options.get('screenshot_size', 'screen')}), "
        f"encode_images {config.encode_images}, {len(os.sched_getaffinity(0))} core(s), "
        f"{pool} CPU pool"
    )
    print(
        f"{'mode':>10} {'N':>5} {'eps/s':>8} {'ideal':>8} {'% ideal':>8} {'lag p50 ms':>10} "
        f"{'lag p99 ms':>10} {'CPU ms/turn':>12} {'faults/turn':>12} {'peak RSS MiB':>13} "
        f"{'loop CPU':>10}"
    )
    try:
        for label in ("cold 1", "cold 2"):
            probe, episodes = await runner.wave(max(sizes))
            print(runner.row(label, max(sizes), probe, episodes), flush=True)
        for mode in modes:
            for n in sizes:
                if mode == "wave":
                    probe, episodes = await runner.wave(n)
                else:
                    probe, episodes = await runner.sustained(n, window)
                print(runner.row(mode, n, probe, episodes), flush=True)
    finally:
        await runner.gym.aclose()


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _peak_rss_mib() -> float:
    """The process's peak resident memory so far (monotone over the rows)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def agent_config(
    path: str | None, turns: int, screenshot_size: tuple[int, int] | None
) -> AgentConfig:
    """The agent settings of ``path`` (default: the embedded default), with the episode length
    fixed (the engine always clicks, so episodes run to ``max_turns``)."""
    agent = load_config(path).cua.agent
    gym = agent.gym
    if screenshot_size is not None:
        options = {**gym.options, "screenshot_size": list(screenshot_size)}
        gym = gym.model_copy(update={"options": options})
    return agent.model_copy(update={"max_turns": turns, "gym": gym})


def pin_to_cores(count: int) -> None:
    """Pin every thread of this process (and those it starts later) to the first cores."""
    cores = set(sorted(os.sched_getaffinity(0))[:count])
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cores)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--sizes", default="1,4,16,64,256")
    parser.add_argument("--mode", choices=("both", "wave", "sustained"), default="both")
    parser.add_argument(
        "--window", type=float, default=12.0, help="seconds counted per sustained row"
    )
    parser.add_argument("--config", default=None, help="agent settings (default: embedded)")
    parser.add_argument(
        "--screenshot-size", default=None, help="override the sim's screenshot size, e.g. 1080x2400"
    )
    parser.add_argument("--cores", type=int, default=0, help="pin the process to this many cores")
    parser.add_argument(
        "--pool",
        choices=("ranked", "fifo"),
        default="ranked",
        help="the CPU pool: cua_native's RankedPool, or a first-in-first-out one",
    )
    args = parser.parse_args()
    tune_for_rollouts()
    if args.cores:
        pin_to_cores(args.cores)
    sizes = [int(s) for s in args.sizes.split(",")]
    size = parse_size(args.screenshot_size) if args.screenshot_size else None
    config = agent_config(args.config, args.turns, size)
    modes = ["wave", "sustained"] if args.mode == "both" else [args.mode]
    asyncio.run(bench(sizes, args.latency, config, modes, args.window, args.pool))


if __name__ == "__main__":
    main()
