"""``python -m cua_native.evaluate``: the trainer's evaluation of a model, without training.

It runs the embedded trainer's own evaluation (``training.embedded.evaluation``) on the config's
evaluation tasks (``cua.eval_tasks``, else ``cua.tasks``; ``--tasks`` narrows them by task
number, ``sim-001`` = 1, or by task id), ``cua.eval_episodes_per_task`` episodes per task
(``--episodes``), on ``cua.device``, from the model the trainer starts from
(``cua.agent.model_path``, or the tiny Qwen3-VL after the configured warm start, both cached):
with the same config and seed its figures are the trainer's baseline. It reads the training
config through the same loader as ``train`` (``--config``, default ``configs/default.yaml``; its
monitor settings say where episodes are recorded); flags and trailing ``key=value`` arguments
override it.

Prints a table per task and in total; ``--json`` makes the LAST line one JSON object with
``episodes``, ``completed``, ``rejected``, ``success_rate``, ``turns_mean``, ``parse_errors`` (by
kind), ``false_done`` (episodes the agent ended with ``terminate(success)`` that failed),
``token_mismatches``, ``outcomes`` (task id → each episode's success), ``failed_groups``,
``model`` (the directory evaluated) and ``leaked_executions`` (executions started minus closed, or what an HTTP gym server that lists
its executions still holds from this run: 0). Bad input (URLs, paths, the database, ``--tasks``)
is one line and a non-zero exit before any model is loaded; every episode rejected, a failed
group or a leaked execution is a non-zero exit too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cua_native import cli_checks
from cua_native.gym.protocol import Execution, Gym, GymError, Task

if TYPE_CHECKING:  # the rollout stack imports AReaL and torch: only once the input is checked
    from cua_native.config import LoadedConfig
    from cua_native.monitor.client.lifecycle import TrainingMonitor
    from cua_native.training.embedded.evaluation import EvalResult


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
        """Executions started and never closed; after ``aclose``, from a server that lists its
        executions: what it still held from this run's creates (orphans of timed-out creates
        too), those the client's close released counted as well (a leak, though cleaned up)."""
        held = getattr(self.inner, "held_at_close", None)
        released = getattr(self.inner, "released_at_close", 0)
        if isinstance(held, int):
            return held + (released if isinstance(released, int) else 0)
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
    if args.episodes is not None:
        overrides.append(f"cua.eval_episodes_per_task={args.episodes}")
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


def render_table(result: EvalResult) -> str:
    header = (
        f"{'task':<28} {'eps':>4} {'ok':>4} {'rej':>4} {'succ':>6} {'reward':>7} {'turns':>6} "
        f"{'perr':>5} {'fdone':>5}"
    )
    lines = [header, "-" * len(header)]
    for name, s in [*sorted(result.per_task.items()), ("TOTAL", result.total)]:
        lines.append(
            f"{name[:28]:<28} {s.episodes:>4} {s.completed:>4} {s.rejected:>4} "
            f"{s.success_rate:>6.2f} {s.reward_mean:>7.3f} {s.turns_mean:>6.2f} "
            f"{sum(s.parse_errors.values()):>5} {s.false_done:>5}"
        )
    return "\n".join(lines)


def summary_json(result: EvalResult, leaked: int) -> dict[str, Any]:
    total = result.total
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
        "outcomes": {task: list(wins) for task, wins in sorted(result.outcomes.items())},
        "failed_groups": result.failed_groups,
        "leaked_executions": leaked,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cua_native.evaluate", description=__doc__)
    parser.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes per task (cua.eval_episodes_per_task; default: the config's)",
    )
    parser.add_argument(
        "--tasks",
        help="of the config's eval tasks, task numbers (1-3,8; sim-001 = 1) or task ids "
        "(sim-001,sim-004); the config's gym seeds still apply",
    )
    parser.add_argument(
        "--config", help="training config YAML (default: configs/default.yaml); uses cua.agent"
    )
    parser.add_argument("--model", help="model directory (default: the cached tiny Qwen3-VL)")
    parser.add_argument("--family", choices=["mai_ui", "qwen3_vl"])
    parser.add_argument("--gym-url", help="base URL of a gym server (HttpGym)")
    parser.add_argument("--gym-id", help="gym id on that server")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="task groups played at once (default: all, as the trainer does)",
    )
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
    if args.episodes is not None and args.episodes < 1:
        raise UsageError("--episodes must be >= 1")
    if args.concurrency is not None and args.concurrency < 1:
        raise UsageError("--concurrency must be >= 1")
    if args.tasks is not None:
        check_task_selection(args.tasks)
    if args.gym_id and not args.gym_url and not args.config:
        raise UsageError("--gym-id needs --gym-url")
    if args.monitor:
        from cua_native.monitor.client.sinks import check_monitor_url

        try:
            check_monitor_url(args.monitor)
        except ValueError as error:
            raise UsageError(f"--monitor: {error}") from None
    return args


def check_task_selection(selection: str) -> None:
    """``--tasks``' grammar, before anything heavy is imported: ``UsageError`` (one line)."""
    from cua_native.rollout.dataset import TaskSource, TaskSourceError

    try:
        TaskSource().narrowed_to(selection)
    except TaskSourceError as error:
        raise UsageError(f"--tasks: {error}") from None


async def amain(args: argparse.Namespace, loaded: LoadedConfig) -> dict[str, Any]:
    """The evaluation; prints its table and returns its JSON summary."""
    result, model, leaked = await run_evaluation(args, loaded)
    print(render_table(result))
    return {**summary_json(result, leaked), "model": str(model)}


async def run_evaluation(
    args: argparse.Namespace, loaded: LoadedConfig
) -> tuple[EvalResult, Path, int]:
    """The trainer's evaluation of the model the trainer starts from: its result, that model's
    directory and the executions leaked."""
    from cua_native.rollout.dataset import TaskSourceError, load_tasks
    from cua_native.rollout.factories import load_processor, make_gym
    from cua_native.rollout.runtime import freeze_startup_heap
    from cua_native.training.embedded.evaluation import eval_task_source, evaluation_for
    from cua_native.training.embedded.model import load_inference_engine, prepare_model

    settings = loaded.cua
    gym = CountingGym(make_gym(settings.agent.gym))
    monitor: TrainingMonitor | None = None
    engine = None
    async with contextlib.AsyncExitStack() as lifecycle:
        try:
            source = eval_task_source(settings.tasks, settings.eval_tasks, args.tasks)
            try:  # the gym first: cheap, and a selection of no task stops before the model
                tasks = await load_tasks(source, gym)
            except TaskSourceError as error:
                raise UsageError(f"--tasks: {error}" if args.tasks else str(error)) from None
            start = await asyncio.to_thread(prepare_model, loaded, progress=not args.no_progress)
            processor = await asyncio.to_thread(load_processor, start.path)
            engine = await load_inference_engine(loaded, start.path)
            freeze_startup_heap()
            if settings.monitor_db_url() or settings.monitor_url:
                monitor = await lifecycle.enter_async_context(
                    await _training_monitor(loaded, settings.run_dir, start.path)
                )
                # a task played under several gym seeds is one task to the monitor
                monitor.tasks(list({t.task_id: t for t in tasks}.values()))
            evaluation = evaluation_for(
                loaded, tasks, gym=gym, processor=processor, monitor=monitor
            )
            result = await evaluation.run(engine, kind="baseline", concurrency=args.concurrency)
        finally:
            if engine is not None:
                await asyncio.to_thread(engine.destroy)
            await gym.aclose()
    return result, start.path, gym.leaked


async def _training_monitor(
    loaded: LoadedConfig, run_dir: Path, model_path: Path
) -> TrainingMonitor:
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
    if summary["failed_groups"]:
        print(f"error: {summary['failed_groups']} task group(s) failed", file=sys.stderr)
        return 1
    return 0 if summary["leaked_executions"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
