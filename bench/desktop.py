"""Local desktop cost: start (desktop + task set-up) and close time, memory per desktop, and
the latency of observe (screenshot) and act (a click, typed text) through the OSWorld-API server.

    uv run python bench/desktop.py [--desktops 3] [--steps 30] [--task calc_formula_cell]

Needs ``.ci/desktop.sh``. Starts N desktops of the task side by side (all live at once), times
each start, sums the resident memory (PSS, from ``/proc/PID/smaps_rollup``) of every process of
each desktop (Xvfb, openbox, the server, the app), then runs ``--steps`` observe and act calls on
each desktop concurrently and prints p50/p99 latency and the aggregate rate, then closes them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from cua_native.actions.models import Action, Click, TypeText
from cua_native.gym.desktop import reaper
from cua_native.gym.desktop.gym import DesktopExecution, DesktopGym


def _pss_mib(pids: list[int]) -> float:
    total_kib = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _line(name: str, values: list[float]) -> str:
    return (
        f"{name:<24} p50 {_pct(values, 0.5):7.1f} ms  p99 {_pct(values, 0.99):7.1f} ms  "
        f"mean {statistics.fmean(values):7.1f} ms  n={len(values)}"
    )


async def _drive(execution: DesktopExecution, steps: int) -> tuple[list[float], list[float]]:
    observe, act = [], []
    actions: list[Action] = [Click(x=0.5, y=0.5), TypeText(text="x")]
    for index in range(steps):
        start = time.perf_counter()
        await execution.observe()
        observe.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        result = await execution.act(actions[index % 2])
        act.append((time.perf_counter() - start) * 1000)
        assert result.ok, result.error
    return observe, act


async def main(desktops: int, steps: int, task_id: str) -> None:
    gym = DesktopGym()
    task = await gym.get_task(task_id)
    starts: list[float] = []

    async def started() -> DesktopExecution:
        begin = time.perf_counter()
        execution = await gym.start(task)
        starts.append((time.perf_counter() - begin) * 1000)
        return execution

    executions = await asyncio.gather(*(started() for _ in range(desktops)))
    try:
        memory = [_pss_mib(reaper.marked_pids(e.local.desktop_id)) for e in executions if e.local]
        print(f"{desktops} desktops of {task_id}, 1280x800")
        print(_line("start + set-up", starts))
        print(
            f"memory per desktop (PSS)  mean {statistics.fmean(memory):.0f} MiB  max {max(memory):.0f} MiB"
        )
        begin = time.perf_counter()
        timings = await asyncio.gather(*(_drive(e, steps) for e in executions))
        elapsed = time.perf_counter() - begin
        observe = [v for o, _ in timings for v in o]
        act = [v for _, a in timings for v in a]
        print(_line("observe (screenshot)", observe))
        print(_line("act (click / type)", act))
        print(f"steps/s (observe + act)  {len(act) / elapsed:.1f} over {desktops} desktops")
    finally:
        closes = []
        for execution in executions:
            begin = time.perf_counter()
            await execution.close()
            closes.append((time.perf_counter() - begin) * 1000)
        print(_line("close", closes))
        await gym.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--desktops", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--task", default="calc_formula_cell")
    args = parser.parse_args()
    asyncio.run(main(args.desktops, args.steps, args.task))
