"""Gym server + HTTP client over loopback: per-call latency and episode throughput.

    uv run python bench/perf/gym_http.py [--gym sim|static] [--episodes 16] [--concurrency 8]
        [--steps 5] [--fault-profile FILE|JSON]

``static`` serves a fixed 1080x2400 UI-like screenshot (``--noise``: incompressible pixels); ``sim`` the embedded
simulator. Also prints the PNG encode cost of one screenshot at compress levels 1 and 6.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from PIL import Image, ImageDraw

from cua_native.actions.models import Action, Click
from cua_native.gym.faults import FaultProfile
from cua_native.gym.http import GymTimeouts, HttpGym, RetryPolicy
from cua_native.gym.protocol import (
    Evaluation,
    Gym,
    Observation,
    Screenshot,
    StepResult,
    Task,
)
from cua_native.gym.server import create_app, load_gym
from cua_native.gym.wire import encode_png


class StaticExecution:
    def __init__(self, execution_id: str, task: Task, image: Image.Image) -> None:
        self.execution_id, self.task, self.image = execution_id, task, image
        self.width, self.height = image.size

    async def observe(self) -> Observation:
        return Observation(Screenshot(image=self.image), self.width, self.height)

    async def act(self, action: Action) -> StepResult:
        return StepResult(ok=True)

    async def evaluate(self, answer: str | None = None) -> Evaluation:
        return Evaluation(reward=0.0, success=False)

    async def close(self) -> None:
        return None


def _ui_like(rng: random.Random) -> Image.Image:
    """A phone-like screen: app bar, list rows with text, an image card."""
    image = Image.new("RGB", (1080, 2400), (250, 250, 250))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 1080, 220), fill=(33, 99, 200))
    draw.text((60, 110), "Settings", fill="white", font_size=64)
    for row in range(14):
        top = 260 + row * 150
        draw.ellipse((50, top + 25, 150, top + 125), fill=(rng.randrange(256), 120, 180))
        draw.text((190, top + 30), f"Row {row} title text", fill=(20, 20, 20), font_size=44)
        draw.text((190, top + 90), "secondary line", fill=(110, 110, 110), font_size=32)
        draw.line((0, top + 149, 1080, top + 149), fill=(220, 220, 220), width=2)
    photo = Image.frombytes("RGB", (400, 250), rng.randbytes(400 * 250 * 3))
    image.paste(photo, (600, 2000))
    return image


class StaticGym:
    """Serves one fixed screenshot: isolates transport + PNG cost from any simulator."""

    gym_id = "static"

    def __init__(self, noise: bool = False) -> None:
        rng = random.Random(0)
        if noise:
            self.image = Image.frombytes("RGB", (1080, 2400), rng.randbytes(1080 * 2400 * 3))
        else:
            self.image = _ui_like(rng)
        self.count = 0

    async def list_tasks(self) -> list[Task]:
        return [Task(task_id="static-001")]

    async def get_task(self, task_id: str) -> Task:
        if task_id != "static-001":
            raise KeyError(task_id)
        return Task(task_id=task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> StaticExecution:
        self.count += 1
        return StaticExecution(f"static-{self.count}", task, self.image)

    async def aclose(self) -> None:
        return None


@contextlib.asynccontextmanager
async def serve(gym: Gym, faults: FaultProfile | None) -> AsyncIterator[str]:
    config = uvicorn.Config(create_app({gym.gym_id: gym}, faults), port=0, log_level="error")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn exited before starting")
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def run(args: argparse.Namespace) -> None:
    static = StaticGym(args.noise) if args.gym == "static" else None
    gym: Gym = static if static is not None else load_gym(args.gym, seed=0)
    faults = FaultProfile.load(args.fault_profile) if args.fault_profile else None
    times: dict[str, list[float]] = defaultdict(list)
    failures: dict[str, int] = defaultdict(int)

    async def timed(name: str, coro: Any) -> Any:
        start = time.perf_counter()
        try:
            return await coro
        finally:
            times[name].append(time.perf_counter() - start)

    async with serve(gym, faults) as url:
        client = HttpGym(
            url,
            gym.gym_id,
            timeouts=GymTimeouts(create=30, read=30, act=30, evaluate=30, terminate=30),
            retries=RetryPolicy(attempts=4, backoff_s=0.05),
            idempotent_create=True,
        )
        tasks = await client.list_tasks()
        limit = asyncio.Semaphore(args.concurrency)

        async def episode(index: int) -> None:
            async with limit:
                execution = None
                try:
                    execution = await timed("create", client.start(tasks[index % len(tasks)]))
                    for _ in range(args.steps):
                        await timed("observe", execution.observe())
                        await timed("act", execution.act(Click(x=0.5, y=0.5)))
                    await timed("evaluate", execution.evaluate())
                except Exception as exc:
                    failures[type(exc).__name__] += 1
                finally:
                    if execution is not None:
                        await timed("close", execution.close())

        start = time.perf_counter()
        await asyncio.gather(*(episode(i) for i in range(args.episodes)))
        wall = time.perf_counter() - start
        await client.aclose()
    await gym.aclose()

    print(
        f"gym={args.gym} episodes={args.episodes} concurrency={args.concurrency} "
        f"steps={args.steps} wall={wall:.2f}s episodes/s={args.episodes / wall:.2f}"
    )
    for name, values in times.items():
        ms = sorted(v * 1000 for v in values)
        p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
        print(f"  {name:9s} n={len(ms):4d} p50={statistics.median(ms):7.1f} ms p95={p95:7.1f} ms")
    if failures:
        print(f"  failures: {dict(failures)}")
    image = StaticGym().image if args.gym == "static" else None
    if image is not None:
        for level in (1, 6):
            start = time.perf_counter()
            size = len(encode_png(image, level))
            print(
                f"  png level {level}: {(time.perf_counter() - start) * 1000:.0f} ms, "
                f"{size / 1e6:.2f} MB"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gym", default="static", help="'static', 'sim' or module:factory")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fault-profile", default=None)
    parser.add_argument("--noise", action="store_true", help="static: incompressible pixels")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
