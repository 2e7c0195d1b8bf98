"""Local desktop cost: start (desktop + task set-up) and close time, memory per desktop, and
the latency of observe (screenshot) and act (a click, typed text) through the OSWorld-API server.

    uv run python bench/perf/desktop.py [--desktops 1 2 4] [--steps 30] [--task calc_formula_cell] \
        [--out bench/perf/results/desktop-capacity/desktop_capacity.json]

Needs ``.ci/desktop.sh``. For each N of ``--desktops``: starts N desktops of the task side by
side (all live at once), times each start, sums the memory (PSS and RSS, from
``/proc/PID/smaps_rollup``) of every process of each desktop (Xvfb, openbox, the server, the
app), then runs ``--steps`` observe and act calls on each desktop concurrently and prints p50/p99
latency and the aggregate rate, times ``--a11y`` fetches of each desktop's accessibility tree
(``/accessibility``: the AT-SPI tree), then closes them and checks that nothing of them is left.
``--out`` writes every N's figures, with the machine's CPU count and load average, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from cua_native.actions.models import Action, Click, TypeText
from cua_native.gym.desktop import reaper
from cua_native.gym.desktop.gym import DesktopExecution, DesktopGym


def _memory_mib(pids: list[int], field: str) -> float:
    """The sum of ``field`` (``Pss:`` or ``Rss:``) over the processes' ``smaps_rollup``."""
    total_kib = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith(field):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return total_kib / 1024


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _figures(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(_pct(values, 0.5), 1),
        "p99_ms": round(_pct(values, 0.99), 1),
        "mean_ms": round(statistics.fmean(values), 1),
        "n": len(values),
    }


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


async def _trees(execution: DesktopExecution, fetches: int) -> tuple[list[float], int]:
    """``fetches`` timed ``/accessibility`` calls, one after another; the last tree's size."""
    times, size = [], 0
    for _ in range(fetches):
        start = time.perf_counter()
        size = len(await execution.accessibility_tree())
        times.append((time.perf_counter() - start) * 1000)
    return times, size


async def measure(desktops: int, steps: int, task_id: str, a11y: int = 5) -> dict[str, Any]:
    gym = DesktopGym()
    task = await gym.get_task(task_id)
    starts: list[float] = []

    async def started() -> DesktopExecution:
        begin = time.perf_counter()
        execution = await gym.start(task)
        starts.append((time.perf_counter() - begin) * 1000)
        return execution

    result: dict[str, Any] = {"desktops": desktops, "task": task_id, "screen": "1280x800"}
    load_before = os.getloadavg()[0]
    executions = await asyncio.gather(*(started() for _ in range(desktops)))
    ids = [e.local.desktop_id for e in executions if e.local]
    try:
        pids = [reaper.marked_pids(desktop_id) for desktop_id in ids]
        pss = [_memory_mib(p, "Pss:") for p in pids]
        rss = [_memory_mib(p, "Rss:") for p in pids]
        print(f"{desktops} desktops of {task_id}, 1280x800")
        print(_line("start + set-up", starts))
        print(
            f"memory per desktop        PSS {statistics.fmean(pss):.0f} MiB  RSS {statistics.fmean(rss):.0f} MiB"
        )
        begin = time.perf_counter()
        timings = await asyncio.gather(*(_drive(e, steps) for e in executions))
        elapsed = time.perf_counter() - begin
        observe = [v for o, _ in timings for v in o]
        act = [v for _, a in timings for v in a]
        step = [o + a for o_list, a_list in timings for o, a in zip(o_list, a_list, strict=True)]
        print(_line("observe (screenshot)", observe))
        print(_line("act (click / type)", act))
        print(_line("step (observe + act)", step))
        print(f"steps/s (observe + act)  {len(act) / elapsed:.1f} over {desktops} desktops")
        result.update(
            start=_figures(starts),
            pss_mib_per_desktop=round(statistics.fmean(pss)),
            rss_mib_per_desktop=round(statistics.fmean(rss)),
            observe=_figures(observe),
            act=_figures(act),
            step=_figures(step),
            steps_per_s=round(len(act) / elapsed, 2),
        )
        if a11y:
            trees = await asyncio.gather(*(_trees(e, a11y) for e in executions))
            fetch = [v for times, _ in trees for v in times]
            size_kb = statistics.fmean(size for _, size in trees) / 1000
            print(_line("accessibility tree", fetch) + f"  {size_kb:.0f} kB")
            result.update(a11y=_figures(fetch), a11y_kb=round(size_kb, 1))
    finally:
        closes = []
        for execution in executions:
            begin = time.perf_counter()
            await execution.close()
            closes.append((time.perf_counter() - begin) * 1000)
        print(_line("close", closes))
        await gym.aclose()
    left = [desktop_id for desktop_id in ids if reaper.marked_pids(desktop_id)]
    result.update(close=_figures(closes), left_after_close=len(left))
    result["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    return result


async def measure_all(
    sizes: list[int], steps: int, task_id: str, a11y: int
) -> list[dict[str, Any]]:
    return [await measure(n, steps, task_id, a11y) for n in sizes]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--desktops", type=int, nargs="+", default=[3])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--task", default="calc_formula_cell")
    parser.add_argument("--a11y", type=int, default=5, help="accessibility-tree fetches each")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    runs = asyncio.run(measure_all(args.desktops, args.steps, args.task, args.a11y))
    if args.out is not None:
        report = {"cpus": os.cpu_count(), "steps_per_desktop": args.steps, "runs": runs}
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
