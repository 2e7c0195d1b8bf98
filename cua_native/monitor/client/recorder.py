"""The monitor recorder: an ``EpisodeObserver`` plus training events that never block or raise.

Every public method is synchronous, thread-safe and cheap: it maps its arguments to rows and
appends them to a bounded in-memory queue. One background task (on the loop ``start`` ran on, or
on the recorder's own thread with ``start_in_thread``) drains the queue every ``flush_interval``
(or as soon as ``batch_size`` rows wait), turns screenshots into data URIs in a worker thread and
hands the rows to one ``SinkChannel`` per sink, which batches, resolves parent ids, and spills to
disk while its sink is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from cua_native.gym.protocol import Screenshot, Task
from cua_native.monitor.client import events
from cua_native.monitor.client.events import TRAINING, Row, utc_now
from cua_native.monitor.client.journal import OpenJournal, Recovered
from cua_native.monitor.client.sinks import HttpSink, Sink, SqlSink
from cua_native.monitor.client.spill import SinkChannel
from cua_native.monitor.screenshots import data_uri
from cua_native.rollout.records import EpisodeContext, EpisodeRecord, TurnRecord

log = logging.getLogger(__name__)

SPILL_DIR = "monitor_spill"

P = ParamSpec("P")
T = TypeVar("T")


def _never_raises(method: Callable[P, None]) -> Callable[P, None]:
    """Recording must not fail the caller: errors are logged and counted."""

    @functools.wraps(method)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            method(*args, **kwargs)
        except Exception:
            recorder = args[0]
            assert isinstance(recorder, Recorder)
            recorder._counts["errors"] += 1
            log.exception("monitor recorder: %s failed", method.__name__)

    return guarded


class Recorder:
    """Records episodes and training progress to the given sinks (none: records nothing)."""

    def __init__(
        self,
        sinks: Sequence[Sink],
        *,
        run_dir: Path | str,
        run_name: str | None = None,
        model_path: str = "",
        queue_size: int = 200_000,
        flush_interval: float = 0.25,
        batch_size: int = 500,
        send_timeout: float = 30.0,
        backoff: tuple[float, float] = (0.5, 30.0),
        executor: Executor | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_name = run_name or self.run_dir.resolve().name
        self.model_path = model_path
        self.queue_size = queue_size
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self._executor = executor
        self._channels = [
            SinkChannel(
                sink,
                self.run_dir / SPILL_DIR,
                batch_rows=batch_size,
                send_timeout=send_timeout,
                backoff=backoff,
            )
            for sink in sinks
        ]
        self._queue: deque[Row] = deque()
        self._journal = OpenJournal(self.run_dir, self.run_name) if sinks else None
        self._adopted: list[Path] = []
        """Journals of dead runs whose rows are queued here: removed once journaled again."""
        self._lock = threading.Lock()
        self._counts = {"queued": 0, "dropped": 0, "errors": 0}
        self._seq = events.SeqClock()
        self._known: set[tuple[str, str]] = set()
        """Parents already queued (tasks, steps, evals, baselines, the training)."""
        self._uris: OrderedDict[int, tuple[Screenshot, str]] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake: asyncio.Event | None = None
        self._signalled = False
        self._writer: asyncio.Task[None] | None = None
        self._state = "new"
        self._thread: threading.Thread | None = None
        self._thread_stop: asyncio.Event | None = None

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._state != "new":
            raise RuntimeError(f"recorder already {self._state}")
        self._state = "running"
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        for channel in self._channels:
            await channel.start()
        self._writer = asyncio.create_task(self._run(), name="monitor-recorder")

    @property
    def state(self) -> str:
        """``new``, ``running``, ``closing`` or ``closed``."""
        return self._state

    async def aclose(self) -> None:
        """Deliver what is queued (or spill it); idempotent; never raises (a failure is logged
        and shows in ``undelivered``)."""
        if self._state != "running":
            self._state = "closed"
            return
        self._state = "closing"
        assert self._wake is not None and self._writer is not None
        self._wake.set()
        try:
            await asyncio.shield(self._writer)
        except asyncio.CancelledError:
            await asyncio.wait({self._writer})
        except Exception:
            log.exception("monitor recorder: writer failed")
        results = await asyncio.gather(
            *(channel.aclose() for channel in self._channels), return_exceptions=True
        )
        for channel, result in zip(self._channels, results, strict=True):
            if isinstance(result, BaseException):
                log.error("monitor sink %s: close failed: %r", channel.sink.name, result)
        if self._journal is not None:  # the run's ends are delivered or spilled
            await asyncio.get_running_loop().run_in_executor(self._executor, self._journal.finish)
        self._state = "closed"

    def undelivered(self) -> list[str]:
        """One line per sink that still holds records, saying how to deliver them."""
        lines = []
        for channel in self._channels:
            line = channel.undelivered_line(self.run_dir)
            if line:
                lines.append(line)
        return lines

    async def __aenter__(self) -> Recorder:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def start_in_thread(self, timeout: float = 60.0) -> None:
        """Run the background writer on a thread of its own (for synchronous callers)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            self._thread_stop = asyncio.Event()
            try:
                await self.start()
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                raise
            ready.set()
            try:
                await self._thread_stop.wait()
            finally:
                await self.aclose()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="monitor")
        self._thread.daemon = True
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("monitor recorder did not start")
        if failure:
            raise failure[0]

    def close_in_thread(self, timeout: float | None = 120.0) -> None:
        """Stop the thread started by ``start_in_thread``, delivering or spilling what is left."""
        if self._thread is None or self._loop is None or self._thread_stop is None:
            return
        self._loop.call_soon_threadsafe(self._thread_stop.set)
        self._thread.join(timeout)
        self._thread = None

    def stats(self) -> dict[str, int]:
        """Counters for ``stats_tracker``: queued/dropped/errors and, per sink, delivered,
        delayed (spilled), rejected, failures, still spilled, waiting for parents."""
        out = {f"monitor/{key}": value for key, value in self._counts.items()}
        out["monitor/pending"] = len(self._queue)
        for channel in self._channels:
            for key, value in channel.stats().items():
                out[f"monitor/{channel.sink.name}/{key}"] = value
        return out

    # --- queueing ----------------------------------------------------------------------------

    def _put(self, rows: list[Row], adopted: Sequence[Path] = ()) -> None:
        with self._lock:
            if self._state in ("closing", "closed") or (
                len(self._queue) + len(rows) > self.queue_size
            ):
                self._counts["dropped"] += len(rows)
                log.warning("monitor recorder: %d rows dropped (queue full or closed)", len(rows))
                return
            for row in rows:
                row.seq = self._seq()
            self._queue.extend(rows)
            self._adopted.extend(adopted)
            self._counts["queued"] += len(rows)
            wake = len(self._queue) >= self.batch_size and not self._signalled
            if wake:
                self._signalled = True
        if wake and self._loop is not None and self._wake is not None:
            if threading.get_ident() == self._loop_thread:
                self._wake.set()
            else:
                self._loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.flush_interval)
            except TimeoutError:
                pass
            self._wake.clear()
            closing = self._state == "closing"
            try:
                await self._flush()
            except Exception:  # never let the writer die
                log.exception("monitor recorder: flush failed")
            if closing:
                return

    async def _flush(self) -> None:
        with self._lock:
            rows = list(self._queue)
            self._queue.clear()
            self._signalled = False
            adopted, self._adopted = self._adopted, []
        if not rows or not self._channels:
            return
        with_images = [row for row in rows if row.screenshot is not None]
        if with_images:
            loop = asyncio.get_running_loop()
            uris = await loop.run_in_executor(
                self._executor, self._screenshot_uris, [r.screenshot for r in with_images]
            )
            for row, uri in zip(with_images, uris, strict=True):
                row.fields["screenshot_uri"] = uri
                row.screenshot = None
        for row in rows:
            _sanitize(row.fields)
        if self._journal is not None:  # before any sink: what a store holds, the journal has
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._journal.append, rows)
            if adopted and not self._journal.broken:
                await loop.run_in_executor(self._executor, _unlink_all, adopted)
        for channel in self._channels:
            channel.submit(rows)

    def _screenshot_uris(self, shots: list[Screenshot | None]) -> list[str | None]:
        """Runs in a worker thread: PNG-encode in-memory images once (by object), keep URLs."""
        uris: list[str | None] = []
        for shot in shots:
            assert shot is not None
            cached = self._uris.get(id(shot))
            if cached is not None and cached[0] is shot:
                uris.append(cached[1])
                continue
            try:
                uri = _screenshot_uri(shot)
            except Exception:
                log.exception("monitor recorder: screenshot could not be encoded")
                uri = None
            self._uris[id(shot)] = (shot, uri or "")
            if len(self._uris) > 1024:
                self._uris.popitem(last=False)
            uris.append(uri)
        return uris

    # --- parents the recorder creates when a child needs them ---------------------------------

    def _ensure(self, row: Row, out: list[Row]) -> None:
        if row.key not in self._known:
            self._known.add(row.key)
            out.append(row)

    def _training_ref(self, out: list[Row]) -> dict[str, tuple[str, str]]:
        """The training as a parent. The row carries no status: a late worker row must never
        turn a finished training back to running."""
        self._ensure(
            Row(
                TRAINING,
                self.run_name,
                {
                    "run_name": self.run_name,
                    "log_path": str(self.run_dir),
                    "model_name": self.model_path or "unknown",
                },
            ),
            out,
        )
        return {"training": (TRAINING, self.run_name)}

    def _source_ref(self, context: EpisodeContext, out: list[Row]) -> tuple[str, tuple[str, str]]:
        """The step, eval or baseline a rollout belongs to (created without a status when this
        recorder has not seen it: another process may own it). A training rollout without a
        ``step`` belongs to the step whose weights generated it: AReaL's version."""
        parent = self._training_ref(out)
        if context.step is not None:
            index = context.step
        else:
            index = context.model_version if context.source == "step" else 0
        model_path = self._model_path(context)
        if context.source == "eval":
            client_id = events.eval_client_id(self.run_name, index)
            fields: dict[str, Any] = {"step": index, "model_path": model_path}
            self._ensure(Row("evals", client_id, fields, parent), out)
            return "eval", ("evals", client_id)
        if context.source == "baseline":
            client_id = events.baseline_client_id(self.run_name, index)
            self._ensure(Row("baselines", client_id, {"model_path": model_path}, parent), out)
            return "baseline", ("baselines", client_id)
        client_id = events.step_client_id(self.run_name, index)
        self._ensure(Row("steps", client_id, {"step": index}, parent), out)
        return "step", ("steps", client_id)

    def _model_path(self, context: EpisodeContext) -> str:
        return str(context.meta.get("model_path") or self.model_path or "unknown")

    # --- EpisodeObserver ---------------------------------------------------------------------

    @_never_raises
    def episode_started(self, context: EpisodeContext) -> None:
        rows: list[Row] = []
        self._ensure(events.task_row(context.task), rows)
        source = self._source_ref(context, rows)
        rows += events.rollout_start_rows(context, source, self._model_path(context))
        self._put(rows)

    @_never_raises
    def turn_finished(self, context: EpisodeContext, turn: TurnRecord) -> None:
        self._put(events.turn_rows(context, turn))

    @_never_raises
    def episode_finished(self, record: EpisodeRecord) -> None:
        self._put(events.episode_end_rows(record))

    # --- training events ---------------------------------------------------------------------

    def _training(self, fields: dict[str, Any]) -> None:
        self._known.add((TRAINING, self.run_name))
        self._put([Row(TRAINING, self.run_name, {"run_name": self.run_name} | fields)])

    @_never_raises
    def training_started(
        self,
        *,
        model_name: str | None = None,
        config: Any = None,
        total_steps: int | None = None,
        log_path: str | None = None,
        **fields: Any,
    ) -> None:
        """``fields``: other training columns (``learning_rate``, ``group_size``, ``seed`` ...)."""
        now = utc_now()
        self._training(
            {
                "log_path": log_path or str(self.run_dir),
                "model_name": model_name or self.model_path or "unknown",
                "status": "running",
                "current_phase": "initialization",
                "total_steps": total_steps,
                "start_time": now,
                "last_heartbeat": now,
                "config_json": config,
                "error_message": None,
                "end_time": None,
            }
            | fields
        )

    @_never_raises
    def training_finished(self, status: str = "completed", *, message: str | None = None) -> None:
        now = utc_now()
        fields: dict[str, Any] = {"status": status, "end_time": now, "last_heartbeat": now}
        if status == "completed":
            fields["progress_percent"] = 100.0
        if message:
            fields["status_message"] = message
        self._training(fields)

    @_never_raises
    def adopt(self, recovered: Recovered) -> None:
        """Send the records of dead runs as their journals left them (``journal.recover``);
        their journals go once this recorder's own journal holds the rows."""
        self._put(recovered.rows, adopted=recovered.journals)

    @_never_raises
    def training_abandoned(self, run_name: str, message: str) -> None:
        """Mark an earlier run of this run directory failed (its process died unannounced)."""
        now = utc_now()
        fields = {
            "run_name": run_name,
            "status": "failed",
            "error_message": message,
            "end_time": now,
        }
        self._put([Row(TRAINING, run_name, fields)])

    @_never_raises
    def training_end_resent(self, run_name: str, status: str, *, ended_at: str) -> None:
        """The end of an earlier run of this run directory whose last records were lost (a
        full disk, a monitor down to the end), as its ledger kept it."""
        fields: dict[str, Any] = {
            "run_name": run_name,
            "status": status,
            "status_message": "its end was recorded late: the run's last records were lost",
            "end_time": ended_at or utc_now(),
        }
        if status == "failed":
            fields["error_message"] = "failed; its error was lost with the run's last records"
        self._put([Row(TRAINING, run_name, fields)])

    @_never_raises
    def training_failed(self, error: BaseException | str) -> None:
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        now = utc_now()
        self._training(
            {"status": "failed", "error_message": message, "end_time": now, "last_heartbeat": now}
        )

    @_never_raises
    def tasks_registered(self, tasks: Iterable[Task]) -> None:
        rows: list[Row] = []
        for task in tasks:
            self._known.add(("tasks", task.task_id))
            rows.append(events.task_row(task))
        self._put(rows)

    @_never_raises
    def step_started(self, step: int, *, total_steps: int | None = None) -> None:
        rows: list[Row] = []
        parent = self._training_ref(rows)
        now = utc_now()
        client_id = events.step_client_id(self.run_name, step)
        self._known.add(("steps", client_id))
        fields = {
            "step": step,
            "status": "rollout_running",
            "current_phase": "rollout_execution",
            "start_time": now,
            "rollout_start_time": now,
        }
        rows.append(Row("steps", client_id, fields, parent))
        training: dict[str, Any] = {
            "current_step": step,
            "current_phase": "rollout",
            "last_heartbeat": now,
        }
        if total_steps:
            training["total_steps"] = total_steps
            training["progress_percent"] = min(100.0, 100.0 * step / total_steps)
        rows.append(Row(TRAINING, self.run_name, training))
        self._put(rows)

    @_never_raises
    def step_training(self, step: int) -> None:
        """Rollouts of the step are collected; the optimizer runs now."""
        now = utc_now()
        client_id = events.step_client_id(self.run_name, step)
        fields = {
            "status": "training",
            "current_phase": "training",
            "rollout_end_time": now,
            "training_start_time": now,
        }
        parent = {"training": (TRAINING, self.run_name)}
        self._put(
            [
                Row("steps", client_id, fields, parent),
                Row(TRAINING, self.run_name, {"current_phase": "training", "last_heartbeat": now}),
            ]
        )

    @_never_raises
    def step_finished(
        self,
        step: int,
        *,
        loss: float | None = None,
        kl: float | None = None,
        reward_mean: float | None = None,
        reward_std: float | None = None,
        num_tokens: int | None = None,
        num_trajectories: int | None = None,
        learning_rate: float | None = None,
        grad_norm: float | None = None,
        checkpoint_path: str | None = None,
        metrics: dict[str, Any] | None = None,
        status: str = "completed",
    ) -> None:
        now = utc_now()
        given = {
            "loss": loss,
            "kl_divergence": kl,
            "reward_mean": reward_mean,
            "reward_std": reward_std,
            "num_tokens": num_tokens,
            "num_trajectories": num_trajectories,
            "learning_rate": learning_rate,
            "policy_gradient_norm": grad_norm,
            "checkpoint_path": checkpoint_path,
            "metrics_json": metrics,
        }
        fields = {k: v for k, v in given.items() if v is not None}
        fields |= {"status": status, "end_time": now, "training_end_time": now}
        if status == "completed":
            fields["progress_percent"] = 100.0
        client_id = events.step_client_id(self.run_name, step)
        parent = {"training": (TRAINING, self.run_name)}
        self._put(
            [
                Row("steps", client_id, {"step": step} | fields, parent),
                Row(TRAINING, self.run_name, {"last_heartbeat": now}),
            ]
        )

    def _eval_like(
        self, kind: str, client_id: str, fields: dict[str, Any], phase: str | None = None
    ) -> None:
        rows: list[Row] = []
        parent = self._training_ref(rows)
        self._known.add((kind, client_id))
        rows.append(
            Row(kind, client_id, {k: v for k, v in fields.items() if v is not None}, parent)
        )
        if phase is not None:
            rows.append(Row(TRAINING, self.run_name, {"current_phase": phase}))
        self._put(rows)

    @_never_raises
    def baseline_started(
        self, model_path: str, *, total_tasks: int | None = None, index: int = 0
    ) -> None:
        fields = {
            "model_path": model_path,
            "status": "running",
            "current_phase": "rollout",
            "start_time": utc_now(),
            "total_tasks": total_tasks,
            "completed_tasks": 0,
        }
        client_id = events.baseline_client_id(self.run_name, index)
        self._eval_like("baselines", client_id, fields, "evaluation")

    @_never_raises
    def baseline_finished(
        self, *, index: int = 0, status: str = "completed", **results: Any
    ) -> None:
        """``results``: ``success_rate``, ``avg_reward``, ``avg_turns``, ``successful_tasks``,
        ``completed_tasks``, ``metrics_json``, ``error_message``."""
        now = utc_now()
        fields = {"status": status, "end_time": now, "eval_time": now} | results
        client_id = events.baseline_client_id(self.run_name, index)
        self._eval_like("baselines", client_id, fields)

    @_never_raises
    def eval_started(self, step: int, model_path: str, *, total_tasks: int | None = None) -> None:
        fields = {
            "step": step,
            "model_path": model_path,
            "status": "running",
            "current_phase": "rollout",
            "start_time": utc_now(),
            "total_tasks": total_tasks,
            "completed_tasks": 0,
        }
        self._eval_like("evals", events.eval_client_id(self.run_name, step), fields, "evaluation")

    @_never_raises
    def eval_progress(
        self, step: int, completed_tasks: int, *, total_tasks: int | None = None
    ) -> None:
        fields: dict[str, Any] = {"step": step, "completed_tasks": completed_tasks}
        if total_tasks:
            fields["total_tasks"] = total_tasks
            fields["current_task_index"] = completed_tasks
        self._eval_like("evals", events.eval_client_id(self.run_name, step), fields)

    @_never_raises
    def eval_finished(self, step: int, *, status: str = "completed", **results: Any) -> None:
        """``results`` as for ``baseline_finished``."""
        now = utc_now()
        fields = {"step": step, "status": status, "end_time": now, "eval_time": now} | results
        self._eval_like("evals", events.eval_client_id(self.run_name, step), fields)


def _sanitize(fields: dict[str, Any]) -> None:
    """Values no monitor can store are fixed before they travel: NaN/infinite numbers and
    integers beyond 64 bits become ``None``, NUL characters U+FFFD."""
    for key, value in list(fields.items()):
        fields[key] = _clean(value)


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _screenshot_uri(shot: Screenshot) -> str:
    if shot.url is not None:
        return shot.url
    if shot.png is not None:
        media = "image/jpeg" if shot.png[:3] == b"\xff\xd8\xff" else "image/png"
        return data_uri(shot.png, media)
    assert shot.image is not None
    buffer = io.BytesIO()
    shot.image.save(buffer, format="PNG", compress_level=1)
    return data_uri(buffer.getvalue())


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def recorder_from_config(
    db_url: str | None,
    monitor_url: str | None,
    token: str | None,
    run_dir: Path | str,
    **options: Any,
) -> Recorder:
    """A recorder writing to the SQL store at ``db_url`` (``"sqlite"`` or ``""``: SQLite in
    ``run_dir``), to a Training Monitor at ``monitor_url``, to both, or to nothing.

    Opening the store runs migrations (blocking): call this before the event loop is busy.
    The store (SQLAlchemy, Alembic) is imported only when a database is named."""
    sinks: list[Sink] = []
    if db_url is not None:
        from cua_native.monitor.db.store import MonitorStore

        url = None if db_url in ("", "sqlite") else db_url
        sinks.append(SqlSink(MonitorStore.open(url, run_dir=run_dir)))
    if monitor_url:
        sinks.append(HttpSink(monitor_url, token))
    return Recorder(sinks, run_dir=run_dir, **options)
