"""Loop throughput: N concurrent episodes on the SimGym against a fixed-latency engine.

The engine is a real ``agenerate`` implementation without a model: it sleeps ``--latency``
seconds, then answers a valid MAI-UI click as token ids. Every other part is the production
path (SimGym, prompt builder with the tiny model's processor, dialect, episode loop). Prints
episodes/s against the latency-bound ideal ``N / (turns * latency)`` and the event-loop lag
(a 10 ms ticker's scheduling delay, p50/p99).

    uv run python bench/loop.py [--latency 1.0] [--turns 4] [--sizes 1,4,16,64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from areal.api.io_struct import ModelRequest, ModelResponse

from cua_native.actions.dialects import get_dialect
from cua_native.actions.models import Click
from cua_native.defaults import load_processor, make_gym, make_kit, tiny_model_dir
from cua_native.episode import run_episode
from cua_native.records import EpisodeContext, NullObserver
from cua_native.workflow_config import AgentConfig, GymConfig


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


async def bench(sizes: list[int], latency: float, turns: int) -> None:
    model_dir = await asyncio.to_thread(tiny_model_dir)
    processor = await asyncio.to_thread(load_processor, model_dir)
    config = AgentConfig(family="mai_ui", max_turns=turns, gym=GymConfig(kind="sim"))
    kit = make_kit(config, processor)
    text = get_dialect("mai_ui").format(Click(x=0.5, y=0.5), thought="tap the middle")
    engine = FixedLatencyEngine(kit.tokenizer, text, kit.gconfig.stop_token_ids[-1], latency)
    gym = make_gym(config.gym)
    tasks = await gym.list_tasks()
    print(f"latency {latency:.3f}s/turn, {turns} turns/episode, tiny processor, SimGym")
    print(
        f"{'N':>5} {'eps/s':>8} {'ideal':>8} {'% ideal':>8} {'lag p50 ms':>11} {'lag p99 ms':>11}"
    )
    try:
        for n in sizes:
            lags: list[float] = []
            stop = asyncio.Event()
            ticker = asyncio.create_task(_ticker(lags, stop))
            start = time.perf_counter()
            runs = await asyncio.gather(
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
            elapsed = time.perf_counter() - start
            stop.set()
            await ticker
            bad = [r.record.reject_reason for r in runs if r.rejected]
            if bad:
                print(f"  {len(bad)} rejected: {sorted(set(map(str, bad)))}")
            rate = n / elapsed
            ideal = n / (turns * latency)
            print(
                f"{n:>5} {rate:>8.2f} {ideal:>8.2f} {100 * rate / ideal:>7.1f}% "
                f"{1000 * statistics.median(lags or [0.0]):>11.2f} "
                f"{1000 * _percentile(lags, 0.99):>11.2f}"
            )
    finally:
        await gym.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--sizes", default="1,4,16,64,256")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    asyncio.run(bench(sizes, args.latency, args.turns))


if __name__ == "__main__":
    main()
