"""``python -m cua_native.evaluate``: run a model on a gym's tasks without training.

Prints a table per task and in total; ``--json`` makes the LAST line one JSON object with
``episodes``, ``completed``, ``rejected``, ``success_rate``, ``turns_mean``, ``parse_errors`` (by
kind), ``false_done`` (episodes the agent ended with ``terminate(success)`` that failed),
``token_mismatches`` and ``leaked_executions`` (executions started minus closed, or what
an HTTP gym server that lists its executions still holds from this run: 0).
It reads the training config through the same loader as ``train`` (``--config``, default
``configs/default.yaml``; its ``cua.agent`` is the agent, its monitor settings say where episodes
are recorded); flags and trailing ``key=value`` arguments override it. With no options it runs the
embedded default: SimGym, the tiny Qwen3-VL (built once, cached), the in-process engine on CPU.
Bad input (URLs, paths, the database) is one line and a non-zero exit before anything heavy is
imported; every episode rejected is a non-zero exit too.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cua_native import cli_checks
from cua_native.gym.protocol import Execution, Gym, GymError, Task
from cua_native.rollout.records import EpisodeContext, EpisodeObserver, EpisodeTally, NullObserver

if TYPE_CHECKING:  # the rollout stack imports AReaL and torch: only once the input is checked
    from cua_native.config import LoadedConfig
    from cua_native.rollout.config import AgentConfig
    from cua_native.rollout.episode import EpisodeRun


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
        """Executions started and never closed; after ``aclose``, what a server that lists its
        executions still holds from this run's creates (orphans of timed-out creates too)."""
        held = getattr(self.inner, "held_at_close", None)
        return held if isinstance(held, int) else self.started - self.closed

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


def build_config(args: argparse.Namespace) -> LoadedConfig:
    """The training config (``--config``, default ``configs/default.yaml``) through the one
    loader, with the command-line flags and ``key=value`` overrides on top."""
    overrides = list(args.overrides)
    if args.model:
        overrides.append(f"cua.agent.model_path={args.model}")
    if args.family:
        overrides.append(f"cua.agent.family={args.family}")
    if args.gym_id:
        overrides.append(f"cua.agent.gym.gym_id={args.gym_id}")
    if args.seed is not None:
        overrides += [f"seed={args.seed}", f"cua.agent.gym.seed={args.seed}"]
    if args.run_dir:
        overrides.append(f"cua.run_dir={args.run_dir}")
    if args.db:
        overrides.append(f"cua.monitor_db={args.db}")
    if args.monitor:
        overrides.append(f"cua.monitor_url={args.monitor}")
    if args.monitor_token:
        overrides.append(f"cua.monitor_token={args.monitor_token}")
    from cua_native.config import load_config

    return load_config(args.config, overrides, gym_url=args.gym_url or None)


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
    from tqdm import tqdm

    from cua_native.rollout.episode import run_with_retry
    from cua_native.rollout.factories import make_agent, media_client

    http = media_client(config.gym)
    agent = make_agent(config, processor, http=http)
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
                agent=agent,
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
        if http is not None:
            await http.aclose()


def render_table(results: Sequence[tuple[Task, EpisodeRun]]) -> tuple[str, EpisodeTally]:
    per_task: dict[str, EpisodeTally] = {}
    total = EpisodeTally()
    for task, run in results:
        per_task.setdefault(task.task_id, EpisodeTally()).episode_finished(run.record)
        total.episode_finished(run.record)
    header = (
        f"{'task':<28} {'eps':>4} {'ok':>4} {'rej':>4} {'succ':>6} {'reward':>7} {'turns':>6} "
        f"{'perr':>5} {'fdone':>5}"
    )
    lines = [header, "-" * len(header)]
    for name, s in [*per_task.items(), ("TOTAL", total)]:
        lines.append(
            f"{name[:28]:<28} {s.episodes:>4} {s.completed:>4} {s.rejected:>4} "
            f"{s.success_rate:>6.2f} {s.reward_mean:>7.3f} {s.turns_mean:>6.2f} "
            f"{sum(s.parse_errors.values()):>5} {s.false_done:>5}"
        )
    return "\n".join(lines), total


def summary_json(total: EpisodeTally, leaked: int) -> dict[str, Any]:
    return {
        "episodes": total.episodes,
        "completed": total.completed,
        "rejected": total.rejected,
        "reject_reasons": total.reject_reasons,
        "success_rate": total.success_rate,
        "reward_mean": total.reward_mean,
        "turns_mean": total.turns_mean,
        "parse_errors": total.parse_errors,
        "false_done": total.false_done,
        "token_mismatches": total.token_mismatches,
        "leaked_executions": leaked,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cua_native.evaluate", description=__doc__)
    parser.add_argument("--episodes", type=int, default=4, help="episodes in total (default 4)")
    parser.add_argument("--tasks", help="task ids and/or index ranges, e.g. 0-3 or a,b")
    parser.add_argument(
        "--config", help="training config YAML (default: configs/default.yaml); uses cua.agent"
    )
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
        help="monitor database (cua.monitor_db): 'sqlite' (RUN_DIR/monitor.db), a SQLAlchemy "
        "URL, or null for none",
    )
    parser.add_argument(
        "--run-dir", help="run directory (cua.run_dir; the tiny model is cached beside it)"
    )
    parser.add_argument("--json", action="store_true", help="last line: a JSON summary")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_intermixed_args(argv)  # key=value overrides may stand anywhere
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


async def amain(args: argparse.Namespace, loaded: LoadedConfig) -> dict[str, Any]:
    from cua_native.rollout.factories import (
        load_engine,
        load_processor,
        make_gym,
        resolve_model_path,
    )
    from cua_native.rollout.runtime import freeze_startup_heap

    config, settings = loaded.cua.agent, loaded.cua
    run_dir = settings.run_dir
    cache_dir = run_dir.parent / ".cache"
    gym = CountingGym(make_gym(config.gym))
    observer: EpisodeObserver = NullObserver()
    monitor = None
    engine = None
    async with contextlib.AsyncExitStack() as lifecycle:
        try:
            tasks = select_tasks(await gym.list_tasks(), args.tasks)  # the gym first: cheap
            model_path = await asyncio.to_thread(resolve_model_path, config.model_path, cache_dir)
            processor = await asyncio.to_thread(load_processor, model_path)
            engine = await load_engine(model_path, seed=loaded.areal.seed)
            freeze_startup_heap()
            if settings.monitor_db_url() or settings.monitor_url:
                monitor = await lifecycle.enter_async_context(
                    await _training_monitor(loaded, run_dir, model_path)
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
                done = EpisodeTally()
                for _, run in results:
                    done.episode_finished(run.record)
                monitor.baseline_finished(
                    success_rate=done.success_rate,
                    avg_reward=done.reward_mean,
                    avg_turns=done.turns_mean,
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


async def _training_monitor(loaded: LoadedConfig, run_dir: Path, model_path: Path) -> Any:
    """The lifecycle of this evaluation: its own training record (a fresh run name, so two
    evaluations in one run directory never merge) holding one baseline."""
    from cua_native.monitor.client.lifecycle import TrainingMonitor, new_run_name
    from cua_native.monitor.client.recorder import recorder_from_config

    settings, config = loaded.cua, loaded.cua.agent
    token = settings.monitor_token or os.environ.get("CUA_MONITOR_TOKEN")
    recorder = await asyncio.to_thread(
        recorder_from_config,
        settings.monitor_db_url(),
        settings.monitor_url,
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


def check_input(args: argparse.Namespace) -> None:
    """Everything about the command line that can be checked before loading anything:
    ``UsageError`` (one line) on the first problem."""
    try:
        if args.run_dir:
            cli_checks.check_run_dir(args.run_dir)
        if args.db and args.db != "null":
            cli_checks.check_monitor_db(args.db, "--db")
        if args.model:
            cli_checks.check_model_dir(args.model)
        if args.gym_url:
            url = cli_checks.check_http_url(args.gym_url, "--gym-url")
            cli_checks.check_gym_reachable(url, args.gym_id or "sim")
    except cli_checks.BadInput as error:
        raise UsageError(str(error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        check_input(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from cua_native.config import ConfigError
    from cua_native.rollout.runtime import tune_for_rollouts, with_cpu_pool

    try:
        loaded = build_config(args)
        if not args.db:  # the config's database, before the model loads (--db is checked)
            try:
                cli_checks.check_monitor_db(loaded.cua.monitor_db)
            except cli_checks.BadInput as error:
                raise ConfigError(f"config error: {error}") from None
        tune_for_rollouts()
        summary = asyncio.run(with_cpu_pool(amain(args, loaded)))
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (ValueError, OSError, GymError) as error:
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError) as error:
        print(f"evaluate: stopped ({error or 'interrupted'})", file=sys.stderr)
        return 143 if "SIGTERM" in str(error) else 130
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    if summary["episodes"] and summary["rejected"] == summary["episodes"]:
        reasons = ", ".join(f"{k}: {v}" for k, v in summary.get("reject_reasons", {}).items())
        print(f"error: every episode was rejected ({reasons or 'infrastructure'})", file=sys.stderr)
        return 1
    return 0 if summary["leaked_executions"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
