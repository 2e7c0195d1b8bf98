"""Loop throughput: N concurrent episodes on the SimGym against a fixed-latency engine.

The engine is a real ``agenerate`` implementation without a model: it sleeps ``--latency``
seconds, then answers a valid MAI-UI click as token ids. Every other part is the production
path (SimGym, prompt builder with the tiny model's processor, dialect, episode loop). Prints
episodes/s against the latency-bound ideal ``N / (turns * latency)`` and the event-loop lag
(a 10 ms ticker's scheduling delay, p50/p99), process CPU per turn, peak RSS and the event
loop thread's CPU share. The first row ("cold") is an untimed-in-spirit warm-up at the largest
size (heap growth, template compilation); the rows after it are the steady state.

    uv run python bench/loop.py [--latency 1.0] [--turns 4] [--sizes 1,4,16,64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from typing import Any

from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.actions.dialects import get_dialect
from cua_native.actions.models import Click
from cua_native.config import load_config
from cua_native.defaults import load_processor, make_gym, make_kit, tiny_model_dir
from cua_native.episode import EpisodeRun, run_episode
from cua_native.gym.sim.gym import parse_size
from cua_native.records import EpisodeContext, NullObserver
from cua_native.runtime import install_cpu_pool, tune_for_rollouts
from cua_native.workflow_config import AgentConfig


class FixedLatencyEngine:
    """Answers every request after ``latency`` seconds with the same formatted click."""

    def __init__(self, tokenizer: Any, text: str, stop_id: int, latency: float) -> None:
        self.output = [*tokenizer.encode(text, add_special_tokens=False), stop_id]
        self.latency = latency

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        await asyncio.sleep(self.latency)
        n = len(self.output)
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=list(self.output),
            output_logprobs=[-0.5] * n,
            output_versions=[0] * n,
            stop_reason="stop",
        )


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


async def bench(sizes: list[int], latency: float, config: AgentConfig) -> None:
    install_cpu_pool(asyncio.get_running_loop())
    model_dir = await asyncio.to_thread(tiny_model_dir)
    processor = await asyncio.to_thread(load_processor, model_dir)
    kit = make_kit(config, processor)
    text = get_dialect("mai_ui").format(Click(x=0.5, y=0.5), thought="tap the middle")
    engine = FixedLatencyEngine(kit.tokenizer, text, kit.gconfig.stop_token_ids[-1], latency)
    gym = make_gym(config.gym)
    tasks = await gym.list_tasks()
    turns = config.max_turns

    async def episodes(n: int) -> list[EpisodeRun]:
        return await asyncio.gather(
            *(
                run_episode(
                    gym=gym,
                    task=tasks[i % len(tasks)],
                    engine=engine,
                    kit=kit,
                    context=EpisodeContext(task=tasks[i % len(tasks)]),
                    observer=NullObserver(),
                )
                for i in range(n)
            )
        )

    print(
        f"latency {latency:.3f}s/turn, {turns} turns/episode, tiny processor "
        f"(max_pixels {kit.builder.sizing.max_pixels}), SimGym "
        f"(screenshot_size {config.gym.options.get('screenshot_size', 'screen')}), "
        f"encode_images {config.encode_images}, {len(os.sched_getaffinity(0))} core(s)"
    )
    print(
        f"{'N':>5} {'eps/s':>8} {'ideal':>8} {'% ideal':>8} {'lag p50 ms':>11} "
        f"{'lag p99 ms':>11} {'CPU ms/turn':>12} {'peak RSS MiB':>13} {'loop CPU':>10}"
    )

    async def measure(n: int, label: str) -> None:
        lags: list[float] = []
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticker(lags, stop))
        cpu_start, loop_cpu_start = time.process_time(), time.thread_time()
        start = time.perf_counter()
        runs = await episodes(n)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        loop_cpu = time.thread_time() - loop_cpu_start
        stop.set()
        await ticker
        bad = [r.record.reject_reason for r in runs if r.rejected]
        if bad:
            print(f"  {len(bad)} rejected: {sorted(set(map(str, bad)))}")
        done_turns = sum(len(r.record.turns) for r in runs) or 1
        rate = n / elapsed
        ideal = n / (turns * latency)
        print(
            f"{label:>5} {rate:>8.2f} {ideal:>8.2f} {100 * rate / ideal:>7.1f}% "
            f"{1000 * statistics.median(lags or [0.0]):>11.2f} "
            f"{1000 * _percentile(lags, 0.99):>11.2f} {1000 * cpu / done_turns:>12.2f} "
            f"{_peak_rss_mib():>13.0f} {100 * loop_cpu / elapsed:>9.0f}%"
        )

    try:
        # Warm-up at the largest size: a training process reaches its steady state (heap grown
        # to its peak, templates compiled, caches filled) in its first batch; this row is that
        # first batch, the rows after it the steady state.
        await measure(max(sizes), "cold")
        for n in sizes:
            await measure(n, str(n))
    finally:
        await gym.aclose()


def _peak_rss_mib() -> float:
    """The process's peak resident memory so far (monotone over the sizes)."""
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--sizes", default="1,4,16,64,256")
    parser.add_argument("--config", default=None, help="agent settings (default: embedded)")
    parser.add_argument(
        "--screenshot-size", default=None, help="override the sim's screenshot size, e.g. 1080x2400"
    )
    parser.add_argument("--cores", type=int, default=0, help="pin the process to this many cores")
    args = parser.parse_args()
    tune_for_rollouts()
    if args.cores:
        pin_to_cores(args.cores)
    sizes = [int(s) for s in args.sizes.split(",")]
    size = parse_size(args.screenshot_size) if args.screenshot_size else None
    config = agent_config(args.config, args.turns, size)
    asyncio.run(bench(sizes, args.latency, config))


if __name__ == "__main__":
    main()
