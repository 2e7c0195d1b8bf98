"""How many of OSWorld's own task files run here: self-contained (no downloads, no accounts, no
web pages) and judged by cua_native's evaluator subset (``gym/desktop/evaluators.py``).

OSWorld's task files are not shipped with cua_native; point this at a checkout of
xlang-ai/OSWorld (its ``evaluation_examples`` folder)::

    uv run python bench/experiments/osworld_examples.py --examples /path/to/OSWorld/evaluation_examples
    uv run python bench/experiments/osworld_examples.py --examples ... --run --only os   # also play set-ups

A task counts as *self-contained* when none of its set-up steps fetches anything (``download``,
``googledrive``, ``login``, ``chrome_open_tabs``, ``chrome_close_tabs``), in ``config`` or the
evaluator's ``postconfig``, and none of its getters reads a cloud file or a web page; as *judged* when it also loads as a cua_native task (its
set-up steps, getters and metrics within the subset). ``infeasible`` tasks are judged by the
agent's final action (the subset's ``infeasible`` evaluator), not by the desktop's state: they
are counted apart. ``--run`` starts a local
desktop per judged task, plays its set-up and evaluates it before any action (every one must be
judged "not solved" without crashing); it executes the task's own set-up commands on a local
desktop, so read them first (``--only`` picks the domains).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

from cua_native.gym.desktop.gym import DesktopGym
from cua_native.gym.desktop.tasks import TaskFileError, task_from_osworld

NETWORK_STEPS = frozenset(
    {"download", "googledrive", "login", "chrome_open_tabs", "chrome_close_tabs"}
)
NETWORK_GETTERS = frozenset({"cloud_file", "googledrive_file", "pdf_from_url"})


def _getters(evaluator: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for key in ("result", "expected"):
        value = evaluator.get(key)
        for spec in value if isinstance(value, list) else [value]:
            if isinstance(spec, dict):
                found.append(spec)
    return found


def classify(task: dict[str, Any], base: Path) -> str:
    """``downloads``, ``infeasible``, ``judged`` or ``not judged: <reason>``."""
    evaluator = task.get("evaluator", {})
    steps = {s.get("type") for s in [*task.get("config", []), *evaluator.get("postconfig", [])]}
    if steps & NETWORK_STEPS or any(g.get("type") in NETWORK_GETTERS for g in _getters(evaluator)):
        return "downloads"
    if evaluator.get("func") == "infeasible":
        return "infeasible"
    try:
        task_from_osworld(json.loads(json.dumps(task)), base)
    except TaskFileError as exc:
        return f"not judged: {str(exc).split(': ', 1)[-1][:60]}"
    return "judged"


async def run_setups(tasks: list[dict[str, Any]], base: Path) -> list[dict[str, Any]]:
    """Play each task's set-up on a fresh local desktop and evaluate it before any action."""
    gym = DesktopGym(tasks=[task_from_osworld(t, base) for t in tasks], window_timeout_s=30)
    rows = []
    for task in await gym.list_tasks():
        started = time.monotonic()
        row: dict[str, Any] = {"id": task.task_id, "instruction": task.instruction[:80]}
        try:
            execution = await gym.start(task)
            try:
                evaluation = await execution.evaluate()
                row.update(setup="ok", reward_before_acting=evaluation.reward)
            finally:
                await execution.close()
        except Exception as exc:  # a set-up this machine cannot play: recorded, not fatal
            row.update(setup=f"failed: {type(exc).__name__}: {str(exc)[:120]}")
        row["seconds"] = round(time.monotonic() - started, 1)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    await gym.aclose()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples", type=Path, required=True, help="OSWorld's evaluation_examples"
    )
    parser.add_argument("--index", default="test_all.json", help="the task list inside it")
    parser.add_argument("--run", action="store_true", help="play the judged tasks' set-ups")
    parser.add_argument("--only", nargs="*", help="domains to run (default: all)")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    args = parser.parse_args(argv)
    index_file = args.examples / args.index
    if not index_file.is_file():
        print(f"error: {index_file} does not exist (give OSWorld's evaluation_examples)")
        return 2
    index = json.loads(index_file.read_text())
    counts: dict[str, collections.Counter[str]] = {}
    judged: list[dict[str, Any]] = []
    for domain, ids in index.items():
        counts[domain] = collections.Counter()
        base = args.examples / "examples" / domain
        for task_id in ids:
            task = json.loads((base / f"{task_id}.json").read_text())
            kind = classify(task, base)
            counts[domain][kind.split(":")[0]] += 1
            if kind == "judged":
                judged.append({**task, "_domain": domain})
    total = sum((c for c in counts.values()), collections.Counter())
    report: dict[str, Any] = {
        "tasks": sum(total.values()),
        "self_contained": sum(total.values()) - total["downloads"],
        "judged_by_state": total["judged"],
        "infeasible": total["infeasible"],
        "by_domain": {d: dict(c) for d, c in counts.items()},
        "judged_ids": [f"{t['_domain']}/{t['id']}" for t in judged],
    }
    if args.run:
        chosen = [t for t in judged if not args.only or t["_domain"] in args.only]
        base_of = {t["id"]: args.examples / "examples" / t["_domain"] for t in chosen}
        for t in chosen:
            t.pop("_domain")
        report["runs"] = asyncio.run(
            run_setups(chosen, next(iter(base_of.values()), args.examples))
        )
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
