"""The training lifecycle, one implementation for every path (embedded trainer, evaluate, and
AReaL's ``PPOTrainer`` on a cluster).

``TrainingMonitor`` is synchronous (AReaL's trainer loop is) and forwards to a ``Recorder``,
whose methods only queue rows and never raise or block. It writes:

- the training row at start (``running``, the real run name, the redacted config), and at the
  end: ``completed`` on a normal exit, ``cancelled`` on Ctrl-C, SIGTERM or task cancellation,
  ``failed`` with the error otherwise (the exception always propagates);
- one step row per step (``step_started`` → ``step_training`` → ``step_finished``); the
  trainer's stats dict is mapped to the step's columns by ``areal_step_columns``;
- the tasks, the baseline and the evals.

Rollouts link to their step by ``EpisodeContext.step`` (the row's ``global_step``), else by the
weights version that generated them (AReaL bumps the version once per step).

Use from synchronous code (an AReaL ``PPOTrainer`` subclass)::

    recorder = recorder_from_config(db_url, monitor_url, token, run_dir, run_name=run_name)
    recorder.start_in_thread()
    monitor = TrainingMonitor(recorder, model_name=path, config=cfg, total_steps=n)
    try:
        with monitor, handle_sigterm():
            monitor.tasks(tasks)
            for step in ...:                     # or from the trainer's hooks
                monitor.step_started(step)
                ...
                monitor.step_finished(step, stats)   # stats: stats_tracker.export_all()
    finally:
        recorder.close_in_thread()
        monitor.report_undelivered()

From async code, ``async with monitor:`` also starts and closes the recorder, makes SIGTERM
cancel the current task, and reports what is still undelivered.

A run directory keeps a ledger of the runs started in it (``monitor_runs.jsonl``) and, per
running process, a journal of the records it opened (``journal.py``). A run that never reached
its end (``kill -9``, power loss) is closed by the next run that starts in the same directory:
its records, in every store, get their last journaled state, open ones ``interrupted`` (without
a journal the run is marked ``failed``); a run that ended but whose last records were lost (a disk full to the
end) gets its end sent again by the next run (``RunLedger``); every run gets a fresh run name,
so reruns never mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from cua_native.gym.protocol import Task
from cua_native.monitor.client import journal
from cua_native.monitor.client.recorder import Recorder
from cua_native.rollout import logs

log = logging.getLogger(__name__)

RUN_NAME_ENV = "CUA_MONITOR_RUN_NAME"
"""Environment variable that hands the run name to rollout worker processes."""
LEDGER = "monitor_runs.jsonl"
SECRET_MARKERS = ("token", "password", "secret", "api_key", "apikey")
REDACTED = "***"

AREAL_STEP_STATS: dict[str, tuple[str, ...]] = {
    "loss": ("ppo_actor/update/actor_loss/avg", "actor_loss/avg", "loss"),
    "kl": ("ppo_actor/update/approx_kl/avg", "approx_kl/avg", "kl"),
    "grad_norm": ("ppo_actor/update/grad_norm", "grad_norm"),
    "learning_rate": ("ppo_actor/update/lr", "lr", "learning_rate"),
    "reward_mean": ("ppo_actor/task_reward/avg", "rollout/cua/reward", "cua/reward", "reward_mean"),
    "reward_std": ("reward_std",),
    "num_tokens": ("ppo_actor/n_valid_tokens", "n_valid_tokens", "num_tokens"),
    "num_trajectories": ("ppo_actor/n_seqs", "n_seqs", "num_trajectories"),
}
"""Step column → the AReaL 1.0.4 ``stats_tracker.export_all()`` names it is read from, first
found wins (checked against AReaL's ``PPOActor.ppo_update`` and ``FSDPEngine.train_batch``)."""
_INT_COLUMNS = frozenset({"num_tokens", "num_trajectories"})


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM by ``handle_sigterm`` outside an event loop.

    A ``KeyboardInterrupt``: Ray's blocking calls (``ray.get``/``ray.wait``, where a trainer on
    AReaL's Ray scheduler spends its time) check signals and end with a ``KeyboardInterrupt``
    when the handler raised one; any other exception raised by the handler is swallowed there
    and the call goes on waiting. Ray raises a new ``KeyboardInterrupt``, which
    ``handle_sigterm`` turns back into ``Terminated`` on its way out."""


def new_run_name(base: str, *, now: datetime | None = None) -> str:
    """``<base>_<UTC YYYYmmdd-HHMMSS>_<6 hex>``: unique per run, readable, sortable."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{base}_{stamp}_{uuid.uuid4().hex[:6]}"


def redact(value: Any) -> Any:
    """A copy of a JSON-like value with every secret-looking key's value replaced."""
    if isinstance(value, Mapping):
        return {
            key: (
                REDACTED
                if isinstance(key, str)
                and any(marker in key.lower() for marker in SECRET_MARKERS)
                and value[key] not in (None, "")
                else redact(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(item) for item in value]
    return value


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def areal_step_columns(stats: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``Recorder.step_finished`` from an AReaL stats dict.

    ``ppo_actor/update/actor_loss/avg`` → ``loss``, ``…/approx_kl/avg`` → ``kl``,
    ``…/grad_norm``, ``…/lr``, ``ppo_actor/task_reward/avg`` (the rollout reward) →
    ``reward_mean``, ``ppo_actor/n_valid_tokens`` / ``n_seqs`` → ``num_tokens`` /
    ``num_trajectories``. Every finite scalar also goes to ``metrics`` (``metrics_json``);
    NaN and infinities are left out (JSON has no such numbers).
    """
    columns: dict[str, Any] = {}
    for column, names in AREAL_STEP_STATS.items():
        for name in names:
            number = _finite(stats.get(name))
            if number is not None:
                columns[column] = int(number) if column in _INT_COLUMNS else number
                break
    metrics = {
        key: number
        for key, value in stats.items()
        if isinstance(key, str) and (number := _finite(value)) is not None
    }
    columns["metrics"] = metrics
    return columns


def _exit_status(exc: BaseException | None) -> tuple[str, str | None]:
    if exc is None:
        return "completed", None
    if isinstance(exc, asyncio.CancelledError):
        reason = " ".join(str(a) for a in exc.args) or "cancelled"
        return "cancelled", reason
    if isinstance(exc, Terminated):
        return "cancelled", "terminated (SIGTERM)"
    if isinstance(exc, KeyboardInterrupt):
        return "cancelled", "interrupted (SIGINT)"
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return "completed", None
    return "failed", f"{type(exc).__name__}: {exc}"


ENDED = ("completed", "failed", "cancelled", "interrupted")
SLOT_BYTES = 512
"""Room kept in the ledger, behind a run's start, for its end (``RunLedger.start``)."""


class RunLedger:
    """``<run_dir>/monitor_runs.jsonl``: one line per run start and end.

    A run's start reserves a line behind it for its end (``SLOT_BYTES``, blank JSON padding),
    which the end overwrites in place: a write into space the file already holds, so the end
    is kept even when the disk has filled up meanwhile (as on ext4, XFS and tmpfs). An end
    whose records did not all reach the monitor says so (``delivered: false``); the next run
    in the directory sends that end again (``ends_to_resend``)."""

    def __init__(self, run_dir: Path | str) -> None:
        self.path = Path(run_dir) / LEDGER
        self._slots: dict[str, int] = {}

    def _entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        entries = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if (
                    isinstance(entry, dict)
                    and isinstance(entry.get("run_name"), str)
                    and entry.get("state") != "reserved"
                ):
                    entries.append(entry)
        return entries

    def _latest(self) -> dict[str, dict[str, Any]]:
        state: dict[str, dict[str, Any]] = {}
        for entry in self._entries():
            state[entry["run_name"]] = entry
        return state

    def unfinished(self) -> list[str]:
        """Runs started here that never wrote an end and whose process is gone."""
        return [
            name
            for name, entry in self._latest().items()
            if entry.get("state") == "running" and not _alive(entry.get("pid"))
        ]

    def ends_to_resend(self) -> list[dict[str, Any]]:
        """The last entries of runs that ended with records undelivered (``delivered: false``)."""
        return [
            entry
            for entry in self._latest().values()
            if entry.get("state") in ENDED and entry.get("delivered") is False
        ]

    def write(self, run_name: str, state: str, **fields: Any) -> None:
        """Append one entry; a full disk is logged, never raised."""
        self._append(self._line(run_name, state, **fields))

    def start(self, run_name: str) -> None:
        """Append the ``running`` entry and the reserved line for the run's end."""
        reserved = json.dumps({"run_name": run_name, "state": "reserved"}).ljust(SLOT_BYTES - 1)
        end = self._append(self._line(run_name, "running") + reserved + "\n")
        if end is not None:
            self._slots[run_name] = end - SLOT_BYTES

    def end(self, run_name: str, state: str, **fields: Any) -> None:
        """Write the run's end into its reserved line (appended when there is none, or when it
        does not fit or was moved)."""
        line = self._line(run_name, state, **fields)
        offset = self._slots.get(run_name)
        if offset is not None and len(line.encode()) <= SLOT_BYTES:
            padded = line[:-1].ljust(SLOT_BYTES - 1) + "\n"
            try:
                with self.path.open("r+b") as handle:
                    handle.seek(offset)
                    held = handle.read(SLOT_BYTES)
                    if _slot_of(held, run_name):
                        handle.seek(offset)
                        handle.write(padded.encode())
                        return
            except OSError as exc:
                log.warning("monitor: could not write %s: %s", self.path, exc)
        self._append(line)

    def _line(self, run_name: str, state: str, **fields: Any) -> str:
        entry = {"run_name": run_name, "state": state, "pid": os.getpid(), "time": _now()}
        return json.dumps(entry | fields) + "\n"

    def _append(self, text: str) -> int | None:
        """Append ``text``; the file's size after it (``None`` when the disk refused)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as handle:
                handle.write(text.encode())
                handle.flush()
                return handle.tell()
        except OSError as exc:  # a full disk must not stop training
            log.warning("monitor: could not write %s: %s", self.path, exc)
            return None


def _slot_of(held: bytes, run_name: str) -> bool:
    """Whether ``held`` is the line ``RunLedger.start`` reserved (or an end written into it)
    for ``run_name``."""
    if len(held) != SLOT_BYTES or not held.endswith(b"\n"):
        return False
    try:
        entry = json.loads(held)
    except ValueError:
        return False
    return isinstance(entry, dict) and entry.get("run_name") == run_name


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now() -> str:
    return datetime.now(UTC).isoformat()


@contextlib.contextmanager
def handle_sigterm() -> Iterator[None]:
    """Make SIGTERM end the run like Ctrl-C: inside an event loop it cancels the current task
    (``CancelledError("SIGTERM")``); in plain synchronous code it raises ``Terminated``. Either
    way ``TrainingMonitor`` records ``cancelled`` and the ``finally`` blocks run. Outside the main
    thread it does nothing."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        task = asyncio.current_task()
        try:
            if task is None:
                raise RuntimeError("no current task")
            loop.add_signal_handler(signal.SIGTERM, task.cancel, "SIGTERM")
        except (NotImplementedError, RuntimeError, ValueError):
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
        return

    received: list[int] = []

    def raise_terminated(signum: int, _frame: Any) -> None:
        received.append(signum)
        raise Terminated("SIGTERM")

    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    except KeyboardInterrupt as error:
        # a Ray call that the signal interrupted raises a plain KeyboardInterrupt instead
        if received and not isinstance(error, Terminated):
            raise Terminated("SIGTERM") from error
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


class TrainingMonitor:
    """The lifecycle of one run; see the module docstring."""

    def __init__(
        self,
        recorder: Recorder,
        *,
        model_name: str,
        config: Any = None,
        total_steps: int | None = None,
        log_path: str | None = None,
        experiment: str | None = None,
        trial: str | None = None,
        **training_fields: Any,
    ) -> None:
        """``training_fields``: other training columns (``learning_rate``, ``group_size``,
        ``seed``, ...). ``config`` goes to ``config_json`` with secrets redacted."""
        self.recorder = recorder
        self.total_steps = total_steps
        self.ledger = RunLedger(recorder.run_dir)
        self.status: str | None = None
        described = {"experiment_name": experiment, "trial_name": trial}
        self._start: dict[str, Any] = {
            "model_name": model_name,
            "config": redact({"config": config, **described} if experiment or trial else config),
            "total_steps": total_steps,
            "log_path": log_path,
            **training_fields,
        }

    @property
    def run_name(self) -> str:
        return self.recorder.run_name

    # --- start and end ----------------------------------------------------------------------

    def start(self) -> None:
        """Close what runs that died in this run directory left open: each record of theirs
        gets, in every store, its last journaled state, open ones ``interrupted``
        (``journal.recover``); a dead run without a journal is marked failed. Then send again
        the ends of runs whose last records were lost, and record this one running. Keeps ``cua_native``'s loggers
        attached first (AReaL's logging set-up detaches them: ``rollout.logs``)."""
        logs.install()
        recovered = journal.recover(self.recorder.run_dir, self.run_name, _alive)
        if recovered.rows:
            self.recorder.adopt(recovered)
        for stale in self.ledger.unfinished():
            if stale == self.run_name:
                continue
            if stale in recovered.runs:  # its journal closed it, records and all
                self.ledger.write(stale, journal.INTERRUPTED)
                continue
            self.recorder.training_abandoned(
                stale, "the process ended without closing the run (killed?)"
            )
            self.ledger.write(stale, "failed")
        for ended in self.ledger.ends_to_resend():
            if ended["run_name"] != self.run_name:
                self.recorder.training_end_resent(
                    ended["run_name"], ended["state"], ended_at=str(ended.get("time") or "")
                )
                self.ledger.write(ended["run_name"], ended["state"], delivered=None)
        self.ledger.start(self.run_name)
        self.recorder.training_started(**self._start)

    def finish(self, status: str = "completed", error: str | None = None) -> None:
        """Record the end: ``completed``, ``cancelled`` (with ``error`` as the reason) or
        ``failed``."""
        self.status = status
        if status == "failed":
            self.recorder.training_failed(error or "failed")
        else:
            self.recorder.training_finished(status, message=error)
        self.ledger.end(self.run_name, status)

    def __enter__(self) -> TrainingMonitor:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish(*_exit_status(exc))

    async def __aenter__(self) -> TrainingMonitor:
        if self.recorder.state == "new":
            await self.recorder.start()
        self._sigterm = handle_sigterm()
        self._sigterm.__enter__()
        self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.finish(*_exit_status(exc))
            self._sigterm.__exit__(None, None, None)
        finally:
            await self.recorder.aclose()
            self.report_undelivered()

    def report_undelivered(self, stream: Any = None) -> list[str]:
        """Print (to stderr) what the recorder could not deliver and how to deliver it. With
        anything undelivered, the ledger's end says so: the next run in the directory sends
        the end again (a full disk may have kept it from the spill)."""
        lines = self.recorder.undelivered()
        for line in lines:
            print(line, file=stream or sys.stderr)
        if lines and self.status is not None:
            self.ledger.end(self.run_name, self.status, delivered=False)
        return lines

    # --- what happens in between ------------------------------------------------------------

    def tasks(self, tasks: Iterable[Task]) -> None:
        self.recorder.tasks_registered(tasks)

    def step_started(self, step: int) -> None:
        self.recorder.step_started(step, total_steps=self.total_steps)

    def step_training(self, step: int) -> None:
        self.recorder.step_training(step)

    def step_finished(
        self, step: int, stats: Mapping[str, Any] | None = None, **columns: Any
    ) -> None:
        """``stats``: the trainer's stats (AReaL names, mapped by ``areal_step_columns``);
        ``columns``: ``Recorder.step_finished`` keywords, which win over the mapped ones
        (``metrics`` dicts are merged)."""
        mapped = areal_step_columns(stats or {})
        extra_metrics = columns.pop("metrics", None) or {}
        mapped.update({k: v for k, v in columns.items() if v is not None})
        mapped["metrics"] = {**mapped.get("metrics", {}), **extra_metrics} or None
        self.recorder.step_finished(step, **mapped)

    def baseline_started(self, model_path: str, total_tasks: int | None = None) -> None:
        self.recorder.baseline_started(model_path, total_tasks=total_tasks)

    def baseline_finished(self, **results: Any) -> None:
        self.recorder.baseline_finished(**results)

    def eval_started(self, step: int, model_path: str, total_tasks: int | None = None) -> None:
        self.recorder.eval_started(step, model_path, total_tasks=total_tasks)

    def eval_progress(self, step: int, completed: int, total: int | None = None) -> None:
        self.recorder.eval_progress(step, completed, total_tasks=total)

    def eval_finished(self, step: int, **results: Any) -> None:
        self.recorder.eval_finished(step, **results)
