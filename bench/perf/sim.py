"""Simulator cost: ms per action + render at 1080×2400, memory per live execution.

    uv run python bench/perf/sim.py [--executions 200] [--shots /tmp/sim_shots]

Times the solution paths of every task (seed 0) step by step: the action alone, the render
alone and both, in this thread (pure CPU, what an executor thread pays), then the async path
(``act`` + ``observe`` through the thread pool). Memory: tracemalloc (Python objects: the
phone state) and RSS (Pillow's frame buffers are not seen by tracemalloc) over N live
executions that each hold one rendered frame. Optionally saves one screenshot per app.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import tracemalloc
from pathlib import Path

from cua_native.actions import models as m
from cua_native.gym.sim import SimExecution, SimGym
from cua_native.gym.sim.screens import build_layout


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096 / 2**20


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _line(name: str, values: list[float]) -> str:
    return (
        f"{name:<22} p50 {_pct(values, 0.5):6.2f} ms  p95 {_pct(values, 0.95):6.2f} ms  "
        f"mean {statistics.fmean(values):6.2f} ms  (n={len(values)})"
    )


async def _solution_actions(gym: SimGym) -> list[tuple[SimExecution, list[m.Action]]]:
    out = []
    for task in await gym.list_tasks():
        probe = await gym.start(task)
        actions = await probe.play_solution()
        await probe.close()
        out.append((await gym.start(task), actions))
    return out


async def timing(gym: SimGym) -> None:
    apply_ms: list[float] = []
    render_ms: list[float] = []
    both_ms: list[float] = []
    for execution, actions in await _solution_actions(gym):
        for action in actions:
            t0 = time.perf_counter()
            execution.phone.apply(action)
            t1 = time.perf_counter()
            gym.renderer.render(execution.state, build_layout(execution.state))
            t2 = time.perf_counter()
            apply_ms.append((t1 - t0) * 1e3)
            render_ms.append((t2 - t1) * 1e3)
            both_ms.append((t2 - t0) * 1e3)
        await execution.close()
    async_ms: list[float] = []
    for execution, actions in await _solution_actions(gym):
        for action in actions:
            t0 = time.perf_counter()
            await execution.act(action)
            await execution.observe()
            async_ms.append((time.perf_counter() - t0) * 1e3)
        await execution.close()
    print(f"screen {gym.width}x{gym.height}, solution paths of {len(await gym.list_tasks())} tasks")
    print(_line("action (apply)", apply_ms))
    print(_line("render (layout+draw)", render_ms))
    print(_line("action+render", both_ms))
    print(_line("async act+observe", async_ms))


async def memory(gym: SimGym, count: int) -> None:
    tasks = await gym.list_tasks()
    gc.collect()
    rss0 = _rss_mib()
    tracemalloc.start()
    snap0 = tracemalloc.take_snapshot()
    executions = []
    for i in range(count):
        execution = await gym.start(tasks[i % len(tasks)], {"seed": i})
        await execution.act(m.OpenApp(name="contacts"))
        await execution.observe()  # every execution holds one rendered frame
        executions.append(execution)
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    rss1 = _rss_mib()
    python = sum(s.size_diff for s in snap1.compare_to(snap0, "filename")) / 2**20
    print(f"executions alive: {gym.live_executions}")
    print(
        f"memory per live execution: {(rss1 - rss0) / count:.2f} MiB RSS "
        f"(frame {gym.width * gym.height * 3 / 2**20:.2f} MiB), "
        f"{python / count * 1024:.1f} KiB Python objects (tracemalloc)"
    )
    await asyncio.gather(*(e.close() for e in executions))


async def shots(gym: SimGym, folder: Path) -> None:
    await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    execution = await gym.start(await gym.get_task("sim-013"))
    for app in ("home", "settings", "contacts", "notes", "shop", "clock"):
        action = m.SystemButton(button="home") if app == "home" else m.OpenApp(name=app)
        await execution.act(action)
        image = (await execution.observe()).screenshot.image
        assert image is not None
        await asyncio.to_thread(image.save, folder / f"{app}.png")
    await execution.close()
    print(f"screenshots: {folder}/*.png")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=200)
    parser.add_argument("--shots", type=Path, default=None)
    args = parser.parse_args()
    gym = SimGym(seed=0)
    await timing(gym)
    await memory(gym, args.executions)
    if args.shots is not None:
        await shots(gym, args.shots)
    await gym.aclose()


if __name__ == "__main__":
    asyncio.run(main())
