"""``python -m cua_native.evaluate``: run a model on a gym's tasks without training.

Prints a table per task and in total; ``--json`` makes the LAST line one JSON object with
``episodes``, ``completed``, ``rejected``, ``success_rate``, ``turns_mean``, ``parse_errors`` (by
kind), ``token_mismatches`` and ``leaked_executions`` (executions started minus closed: 0).
With no options it runs the embedded default: SimGym, the tiny Qwen3-VL (built once, cached),
the in-process engine on CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from tqdm import tqdm

from cua_native.actions.errors import ERROR_KINDS
from cua_native.gym.protocol import Execution, Gym, Task
from cua_native.rollout.config import AgentConfig, GymConfig
from cua_native.rollout.episode import EpisodeRun, run_with_retry
from cua_native.rollout.factories import (
    load_engine,
    load_processor,
    make_gym,
    make_kit,
    resolve_model_path,
)
from cua_native.rollout.records import EpisodeContext, EpisodeObserver, NullObserver
from cua_native.rollout.runtime import freeze_startup_heap, tune_for_rollouts, with_cpu_pool


class UsageError(ValueError):
    """A bad option: reported as one line, exit status 2."""


class CountingGym:
    """Wraps a gym and counts executions started and closed (the leak check)."""

    def __init__(self, gym: Gym) -> None:
        self.inner = gym
        self.gym_id = gym.gym_id
        self.started = 0
        self.closed = 0

    @property
    def leaked(self) -> int:
        return self.started - self.closed

    async def list_tasks(self) -> list[Task]:
        return await self.inner.list_tasks()

    async def get_task(self, task_id: str) -> Task:
        return await self.inner.get_task(task_id)

    async def start(self, task: Task, options: dict[str, Any] | None = None) -> Execution:
        execution = await self.inner.start(task, options)
        self.started += 1
        return _CountedExecution(execution, self)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CountedExecution:
    def __init__(self, inner: Execution, ledger: CountingGym) -> None:
        self.inner = inner
        self.ledger = ledger
        self.execution_id = inner.execution_id
        self.task = inner.task
        self._closed = False

    async def observe(self) -> Any:
        return await self.inner.observe()

    async def act(self, action: Any) -> Any:
        return await self.inner.act(action)

    async def evaluate(self, answer: str | None = None) -> Any:
        return await self.inner.evaluate(answer)

    async def close(self) -> None:
        await self.inner.close()
        if not self._closed:
            self._closed = True
            self.ledger.closed += 1


def select_tasks(tasks: Sequence[Task], spec: str | None) -> list[Task]:
    """``spec``: comma-separated task ids and/or 0-based index ranges (``3``, ``0-4``)."""
    if not tasks:
        raise UsageError("the gym has no tasks")
    if not spec:
        return list(tasks)
    by_id = {task.task_id: task for task in tasks}
    chosen: list[Task] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if item in by_id:
            chosen.append(by_id[item])
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if match is None:
            raise UsageError(f"--tasks: unknown task id {item!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if low > high or high >= len(tasks):
            raise UsageError(f"--tasks: range {item!r} outside 0-{len(tasks) - 1}")
        chosen.extend(tasks[low : high + 1])
    if not chosen:
        raise UsageError("--tasks selects no task")
    return chosen


def load_config(args: argparse.Namespace) -> AgentConfig:
    """``--config`` YAML (``AgentConfig`` fields; ``model`` is an alias of ``model_path``),
    then the command-line overrides."""
    data: dict[str, Any] = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise UsageError(f"--config: no such file {args.config!r}")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as error:
            raise UsageError(f"--config: not valid YAML ({error})") from None
        if not isinstance(loaded, dict):
            raise UsageError("--config: the top level must be a mapping")
        data = dict(loaded)
        if "model" in data:
            data["model_path"] = data.pop("model")
    if args.model:
        data["model_path"] = args.model
    if args.family:
        data["family"] = args.family
    if args.gym_url:
        data["gym"] = {**data.get("gym", {}), "kind": "http", "base_url": args.gym_url}
    if args.gym_id:
        data["gym"] = {**data.get("gym", {}), "gym_id": args.gym_id}
    try:
        config = AgentConfig.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"bad config: {where}: {first['msg']}") from None
    if config.gym.kind == "http" and not config.gym.base_url:
        raise UsageError("an HTTP gym needs --gym-url (or gym.base_url)")
    return config


@dataclass(slots=True)
class Summary:
    """Totals over a set of episode runs."""

    episodes: int = 0
    completed: int = 0
    rejected: int = 0
    successes: int = 0
    turns: int = 0
    reward: float = 0.0
    parse_errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    token_mismatches: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)

    def add(self, run: EpisodeRun) -> None:
        record = run.record
        self.episodes += 1
        if run.rejected:
            self.rejected += 1
            reason = record.reject_reason or "unknown"
            self.reject_reasons[reason] = self.reject_reasons.get(reason, 0) + 1
            return
        self.completed += 1
        self.successes += int(record.success)
        self.turns += len(record.turns)
        self.reward += record.reward
        for kind, count in record.parse_errors.items():
            self.parse_errors[kind] = self.parse_errors.get(kind, 0) + count
        self.token_mismatches += sum(turn.token_mismatch for turn in record.turns)

    def mean(self, total: float) -> float:
        return total / self.completed if self.completed else 0.0


async def evaluate(
    config: AgentConfig,
    tasks: Sequence[Task],
    *,
    gym: CountingGym,
    engine: Any,
    processor: Any,
    episodes: int,
    concurrency: int,
    observer: EpisodeObserver,
    progress: bool = True,
) -> list[tuple[Task, EpisodeRun]]:
    """Run ``episodes`` episodes, round-robin over ``tasks``, at most ``concurrency`` at once."""
    kit = make_kit(config, processor)
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=episodes, file=sys.stderr, disable=not progress, desc="episodes")
    group_id = uuid.uuid4().hex

    async def one(ordinal: int) -> tuple[Task, EpisodeRun]:
        task = tasks[ordinal % len(tasks)]
        async with gate:
            run = await run_with_retry(
                gym=gym,
                task=task,
                engine=engine,
                kit=kit,
                make_context=lambda attempt: EpisodeContext(
                    task=task,
                    group_id=group_id,
                    attempt=attempt,
                    source="baseline",
                    step=0,
                    meta={"ordinal": ordinal},
                ),
                observer=observer,
            )
        bar.update(1)
        return task, run

    try:
        return list(await asyncio.gather(*(one(i) for i in range(episodes))))
    finally:
        bar.close()


def render_table(results: Sequence[tuple[Task, EpisodeRun]]) -> tuple[str, Summary]:
    per_task: dict[str, Summary] = {}
    total = Summary()
    for task, run in results:
        per_task.setdefault(task.task_id, Summary()).add(run)
        total.add(run)
    header = f"{'task':<28} {'eps':>4} {'ok':>4} {'rej':>4} {'succ':>6} {'reward':>7} {'turns':>6} {'perr':>5}"
    lines = [header, "-" * len(header)]
    for name, s in [*per_task.items(), ("TOTAL", total)]:
        lines.append(
            f"{name[:28]:<28} {s.episodes:>4} {s.completed:>4} {s.rejected:>4} "
            f"{s.mean(s.successes):>6.2f} {s.mean(s.reward):>7.3f} {s.mean(s.turns):>6.2f} "
            f"{sum(s.parse_errors.values()):>5}"
        )
    return "\n".join(lines), total


def summary_json(total: Summary, leaked: int) -> dict[str, Any]:
    return {
        "episodes": total.episodes,
        "completed": total.completed,
        "rejected": total.rejected,
        "reject_reasons": total.reject_reasons,
        "success_rate": total.mean(total.successes),
        "reward_mean": total.mean(total.reward),
        "turns_mean": total.mean(total.turns),
        "parse_errors": total.parse_errors,
        "token_mismatches": total.token_mismatches,
        "leaked_executions": leaked,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cua_native.evaluate", description=__doc__)
    parser.add_argument("--episodes", type=int, default=4, help="episodes in total (default 4)")
    parser.add_argument("--tasks", help="task ids and/or index ranges, e.g. 0-3 or a,b")
    parser.add_argument("--config", help="YAML with AgentConfig fields (gym, model, ...)")
    parser.add_argument("--model", help="model directory (default: the cached tiny Qwen3-VL)")
    parser.add_argument("--family", choices=["mai_ui", "qwen3_vl"])
    parser.add_argument("--gym-url", help="base URL of a gym server (HttpGym)")
    parser.add_argument("--gym-id", help="gym id on that server")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None, help="simulator and sampling seed")
    parser.add_argument("--monitor", help="Training Monitor base URL to record the episodes to")
    parser.add_argument(
        "--monitor-token", help="bearer token for --monitor (default: $CUA_MONITOR_TOKEN)"
    )
    parser.add_argument(
        "--db",
        help="record to a monitor database: 'sqlite' (RUN_DIR/monitor.db) or a SQLAlchemy URL",
    )
    parser.add_argument(
        "--run-dir", help="run directory (model cache under RUN_DIR/.cache; default runs)"
    )
    parser.add_argument("--json", action="store_true", help="last line: a JSON summary")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise UsageError("--episodes must be >= 1")
    if args.concurrency < 1:
        raise UsageError("--concurrency must be >= 1")
    if args.gym_id and not args.gym_url and not args.config:
        raise UsageError("--gym-id needs --gym-url")
    if args.monitor:
        from cua_native.monitor.client.sinks import check_monitor_url

        try:
            check_monitor_url(args.monitor)
        except ValueError as error:
            raise UsageError(f"--monitor: {error}") from None
    return args


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    config = load_config(args)
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs")
    cache_dir = run_dir / ".cache"
    model_path = await asyncio.to_thread(resolve_model_path, config.model_path, cache_dir)
    gym = CountingGym(make_gym(_with_seed(config.gym, args.seed)))
    observer: EpisodeObserver = NullObserver()
    monitor = None
    engine = None
    async with contextlib.AsyncExitStack() as lifecycle:
        try:
            tasks = select_tasks(await gym.list_tasks(), args.tasks)
            processor = await asyncio.to_thread(load_processor, model_path)
            engine = await load_engine(model_path, seed=args.seed or 0)
            freeze_startup_heap()
            if args.monitor or args.db:
                monitor = await lifecycle.enter_async_context(
                    await _training_monitor(args, config, run_dir, model_path)
                )
                monitor.tasks(tasks)
                monitor.baseline_started(str(model_path), total_tasks=args.episodes)
                observer = monitor.recorder
            results = await evaluate(
                config,
                tasks,
                gym=gym,
                engine=engine,
                processor=processor,
                episodes=args.episodes,
                concurrency=args.concurrency,
                observer=observer,
                progress=not args.no_progress,
            )
            if monitor is not None:
                done = Summary()
                for _, run in results:
                    done.add(run)
                monitor.baseline_finished(
                    success_rate=done.successes / done.completed if done.completed else 0.0,
                    avg_reward=done.mean(done.reward),
                    avg_turns=done.mean(done.turns),
                    successful_tasks=done.successes,
                    completed_tasks=done.completed,
                )
        finally:
            if engine is not None:
                await asyncio.to_thread(engine.destroy)
            await gym.aclose()
    table, total = render_table(results)
    print(table)
    return summary_json(total, gym.leaked)


async def _training_monitor(
    args: argparse.Namespace, config: AgentConfig, run_dir: Path, model_path: Path
) -> Any:
    """The lifecycle of this evaluation: its own training record (a fresh run name, so two
    evaluations in one run directory never merge) holding one baseline."""
    from cua_native.monitor.client.lifecycle import TrainingMonitor, new_run_name
    from cua_native.monitor.client.recorder import recorder_from_config

    token = args.monitor_token or os.environ.get("CUA_MONITOR_TOKEN")
    recorder = await asyncio.to_thread(
        recorder_from_config,
        args.db,
        args.monitor,
        token,
        run_dir,
        model_path=str(model_path),
        run_name=new_run_name(f"evaluate_{run_dir.name or 'run'}"),
    )
    return TrainingMonitor(
        recorder,
        model_name=str(model_path),
        config={"evaluate": config.model_dump(mode="json")},
        total_steps=0,
        log_path=str(run_dir),
    )


def _with_seed(gym: GymConfig, seed: int | None) -> GymConfig:
    return gym if seed is None else gym.model_copy(update={"seed": seed})


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        tune_for_rollouts()
        summary = asyncio.run(with_cpu_pool(amain(args)))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as error:
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError) as error:
        print(f"evaluate: stopped ({error or 'interrupted'})", file=sys.stderr)
        return 143 if "SIGTERM" in str(error) else 130
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary["leaked_executions"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
