"""The monitor's SQL store: applies ingest batches (``ingest.py``) to SQLite or PostgreSQL.

One writer: ``ingest`` holds a lock and applies a whole batch in one transaction (all or nothing).
``aingest`` runs it on the store's own single worker thread, so the event loop never blocks.
Status changes write ``status_history`` rows; progress fields are recomputed from the rows after
each batch.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy import String, case, create_engine, event, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from cua_native.monitor.ingest import (
    ARRAY_KINDS,
    IngestBatch,
    IngestError,
    TrainingIn,
    parse_batch,
)
from cua_native.monitor.screenshots import ScreenshotError, ScreenshotStore, is_data_uri
from cua_native.monitor.service.migrations.runner import upgrade_to_head
from cua_native.monitor.service.schema import (
    Action,
    Base,
    Baseline,
    Environment,
    Eval,
    Obs,
    Rollout,
    StatusHistory,
    Step,
    Task,
    Training,
    Turn,
    Validation,
    Validator,
)

TERMINAL_ROLLOUT = ("completed", "failed", "cancelled")
ENDED_TRAINING = ("failed", "cancelled")
SQLITE_FILE = "monitor.db"
JSON_FIELDS = frozenset(
    {
        "config_json",
        "metrics_json",
        "summary_json",
        "details_json",
        "model_input_json",
        "tags",
        "prerequisites",
        "errors",
        "tool_args",
        "tokens",
        "logprobs",
        "rollout_progress",
        "training_progress",
        "trajectory_data_json",
        "action_json",
        "action_args",
        "model_specific_input_json",
    }
)
TRAINING_DEFAULTS = {"log_path": "", "model_name": "unknown"}
"""What a new training gets when the sender gives none (the existing client's first post has
only ``run_name``, ``status``, ``current_phase``, ``experiment_name`` and ``trial_name``)."""


@dataclass(frozen=True, slots=True)
class _Kind:
    model: type[Base]
    entity: str
    foreign_keys: Mapping[str, tuple[str, type[Base]]] = field(default_factory=dict)
    """column → (client-id key in the record, parent model)."""
    natural_key: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    """NOT NULL columns without default: needed when the record creates the row."""
    has_status: bool = False


_TRAINING_FK = {"training_id": ("training_client_id", Training)}
KINDS: dict[str, _Kind] = {
    "tasks": _Kind(Task, "task", {}, ("task_id",), ("task_id", "name", "description")),
    "validators": _Kind(
        Validator,
        "validator",
        {"task_id": ("task_client_id", Task)},
        (),
        ("task_id", "validator_type"),
    ),
    "baselines": _Kind(Baseline, "baseline", _TRAINING_FK, (), ("training_id", "model_path"), True),
    "evals": _Kind(
        Eval,
        "eval",
        _TRAINING_FK,
        ("training_id", "step"),
        ("training_id", "step", "model_path"),
        True,
    ),
    "steps": _Kind(
        Step, "step", _TRAINING_FK, ("training_id", "step"), ("training_id", "step"), True
    ),
    "rollouts": _Kind(
        Rollout,
        "rollout",
        {
            "step_id": ("step_client_id", Step),
            "eval_id": ("eval_client_id", Eval),
            "baseline_id": ("baseline_client_id", Baseline),
            "task_id": ("task_client_id", Task),
            "env_id": ("env_client_id", Environment),
        },
        ("rollout_id",),
        ("source_type", "rollout_id", "task_id", "model_path"),
        True,
    ),
    "environments": _Kind(
        Environment,
        "environment",
        {"rollout_id": ("rollout_client_id", Rollout)},
        (),
        ("env_type",),
        True,
    ),
    "turns": _Kind(
        Turn,
        "turn",
        {"rollout_id": ("rollout_client_id", Rollout)},
        ("rollout_id", "turn"),
        ("rollout_id", "turn"),
    ),
    "actions": _Kind(Action, "action", {"turn_id": ("turn_client_id", Turn)}, (), ("turn_id",)),
    "observations": _Kind(Obs, "obs", {"turn_id": ("turn_client_id", Turn)}, (), ("turn_id",)),
    "validations": _Kind(
        Validation,
        "validation",
        {
            "rollout_id": ("rollout_client_id", Rollout),
            "validator_id": ("validator_client_id", Validator),
        },
        (),
        ("rollout_id", "success"),
    ),
}
SOURCE_COLUMNS = {"step": "step_id", "eval": "eval_id", "baseline": "baseline_id"}


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def default_sqlite_url(run_dir: Path | str) -> str:
    return f"sqlite:///{Path(run_dir).resolve() / SQLITE_FILE}"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, foreign keys and a busy timeout on each connection."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})


def _to_column(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in JSON_FIELDS:
        return value if isinstance(value, str) else json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


class MonitorStore:
    """The SQL side of the ingest contract plus read access for the dashboard."""

    def __init__(self, engine: Engine, run_dir: Path | str) -> None:
        self.engine = engine
        self.run_dir = Path(run_dir).resolve()
        self.screenshots = ScreenshotStore(self.run_dir)
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._write_lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="monitor-store")

    @classmethod
    def open(cls, url: str | None = None, *, run_dir: Path | str) -> MonitorStore:
        """Open (and migrate to head) the store at ``url``; default: SQLite in ``run_dir``."""
        run_path = Path(run_dir)
        run_path.mkdir(parents=True, exist_ok=True)
        engine = make_engine(url or default_sqlite_url(run_path))
        try:
            upgrade_to_head(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, run_path)

    @classmethod
    async def aopen(cls, url: str | None = None, *, run_dir: Path | str) -> MonitorStore:
        return await asyncio.to_thread(cls.open, url, run_dir=run_dir)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read session (the dashboard's queries)."""
        with self._sessions() as session:
            yield session

    def ingest(self, batch: dict[str, Any] | IngestBatch) -> dict[str, Any]:
        """Apply one batch; answer ``{training_id?, kind: [{client_id, id}]}``.

        Raises ``IngestError`` (nothing written) on any invalid record."""
        try:
            parsed = batch if isinstance(batch, IngestBatch) else parse_batch(batch)
        except ValidationError as exc:
            raise IngestError(f"invalid batch: {exc}") from exc
        with self._write_lock, self._sessions() as session:
            try:
                with session.begin():
                    return _BatchWriter(session, self.screenshots).apply(parsed)
            except IntegrityError as exc:
                raise IngestError(f"batch violates a database rule: {exc.orig}") from exc
            except ScreenshotError as exc:
                raise IngestError(str(exc)) from exc

    async def aingest(self, batch: dict[str, Any] | IngestBatch) -> dict[str, Any]:
        """``ingest`` on the store's writer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self.ingest, batch)


class _BatchWriter:
    """Applies one parsed batch inside an open transaction."""

    def __init__(self, session: Session, screenshots: ScreenshotStore) -> None:
        self.session = session
        self.screenshots = screenshots
        self.now = utcnow()
        self.touched: dict[str, set[int]] = {kind: set() for kind in KINDS}
        self.touched_trainings: set[int] = set()
        self.ended_trainings: dict[int, str] = {}
        self.rows: dict[tuple[type[Base], str], Any] = {}
        self.created_ids: dict[type[Base], set[int]] = {}
        """Rows this batch wrote, by model (their children cannot be in the database yet)."""
        self.history: list[tuple[str, Any, str | None]] = []
        self.linked_rollouts: list[Rollout] = []

    def _prefetch(self, model: type[Base], client_ids: list[str]) -> None:
        """One query for every client id of a kind in the batch."""
        wanted = [c for c in set(client_ids) if (model, c) not in self.rows]
        if not wanted:
            return
        found: Iterable[Any] = self.session.scalars(
            select(model).where(model.client_id.in_(wanted))  # type: ignore[attr-defined]
        )
        for row in found:
            self.rows[(model, row.client_id)] = row
        for client_id in wanted:
            self.rows.setdefault((model, client_id), None)

    def _after_flush(self) -> None:
        for entity, row, old_status in self.history:
            self._history(entity, row, old_status)
        self.history.clear()
        for rollout in self.linked_rollouts:
            environment = self.session.get(Environment, rollout.env_id)
            if environment is not None and environment.rollout_id is None:
                environment.rollout_id = rollout.id
        self.linked_rollouts.clear()
        """Trainings this batch moved to ``failed``/``cancelled``: their open children close."""

    def apply(self, batch: IngestBatch) -> dict[str, Any]:
        answer: dict[str, Any] = {}
        if batch.training is not None:
            answer["training_id"] = self._training(batch.training)
        # Environments come before rollouts (the existing client links rollout → environment),
        # except those that name their rollout (the other direction): they come after it.
        environments = list(enumerate(batch.environments))
        linked = [(i, e) for i, e in environments if e.rollout_client_id or e.rollout_id]
        deferred = {i for i, _ in linked}
        plan: list[tuple[str, list[tuple[int, Any]]]] = []
        for kind in ARRAY_KINDS:
            if kind == "environments":
                plan.append((kind, [(i, e) for i, e in environments if i not in deferred]))
            else:
                plan.append((kind, list(enumerate(getattr(batch, kind)))))
            if kind == "rollouts":
                plan.append(("environments", linked))
        for kind, records in plan:
            if not records:
                continue
            model = KINDS[kind].model
            self._prefetch(model, [r.client_id for _, r in records if r.client_id is not None])
            with self.session.no_autoflush:
                written = [
                    (position, record, self._upsert(kind, record)) for position, record in records
                ]
            self.session.flush()  # one round of INSERTs per kind, not one per record
            self._after_flush()
            slots = answer.setdefault(kind, [None] * len(getattr(batch, kind)))
            for position, record, row in written:
                slots[position] = _mapping(record.client_id, row.id)
                self.touched[kind].add(row.id)
                self.created_ids.setdefault(model, set()).add(row.id)
        self.session.flush()
        for training_id, status in self.ended_trainings.items():
            _close_children(self.session, training_id, status, self.now)
        if self.ended_trainings:
            self.session.expire_all()
        _Progress(self.session, self.now).refresh(self.touched, self.touched_trainings)
        return answer

    def _lookup(self, model: type[Base], client_id: str) -> Any:
        """The row of a client id (cached for the batch: an episode's turns all name one
        rollout, its actions the turns just written)."""
        key = (model, client_id)
        if key not in self.rows:
            self.rows[key] = self.session.scalars(
                select(model).where(model.client_id == client_id)  # type: ignore[attr-defined]
            ).first()
        return self.rows[key]

    def _training(self, record: TrainingIn) -> int:
        values = {k: _to_column(k, v) for k, v in record.given().items()}
        training_id = values.pop("training_id", None)
        client_id = values.pop("client_id", None)
        row: Training | None = None
        if training_id is not None:
            row = self.session.get(Training, training_id) if abs(training_id) < 2**31 else None
            if row is None:
                raise IngestError(f"training: unknown training_id {training_id}")
            run_name = values.get("run_name")
            if run_name is not None and row.run_name != run_name:
                raise IngestError(
                    f"training: training_id {training_id} is run {row.run_name!r}, not {run_name!r}"
                )
        if row is None and client_id is not None:
            row = self._lookup(Training, client_id)
        if row is None and values.get("run_name") is not None:
            row = self.session.scalars(
                select(Training).where(Training.run_name == values["run_name"])
            ).first()
        if row is None:
            values = TRAINING_DEFAULTS | values
        kind = _Kind(Training, "training", {}, (), ("run_name", "log_path", "model_name"), True)
        before = row.status if row is not None else None
        row = self._write(kind, row, client_id, values, label=client_id or str(training_id))
        self.session.flush()
        self._after_flush()
        self.touched_trainings.add(row.id)
        if row.client_id is not None:
            self.rows[(Training, row.client_id)] = row
        if row.status in ENDED_TRAINING and row.status != before:
            self.ended_trainings[row.id] = row.status
        return row.id

    def _upsert(self, kind_name: str, record: BaseModel) -> Any:
        kind = KINDS[kind_name]
        values = record.model_dump(exclude_unset=True)
        client_id: str | None = values.pop("client_id", None)
        for column, (client_key, parent) in kind.foreign_keys.items():
            if client_key in values:
                parent_client_id = values.pop(client_key)
                if parent_client_id is None:
                    continue
                parent_row = self._lookup(parent, parent_client_id)
                if parent_row is None:
                    raise IngestError(
                        f"{kind_name}[{client_id}]: unknown {client_key} {parent_client_id!r}"
                    )
                values[column] = parent_row.id
        values = {k: _to_column(k, v) for k, v in values.items()}
        if kind.model is Obs and is_data_uri(values.get("screenshot_uri") or ""):
            values["screenshot_uri"] = self.screenshots.put_data_uri(values["screenshot_uri"])
        _contract_extras(kind.model, values)
        row = self._lookup(kind.model, client_id) if client_id is not None else None
        if (
            row is None
            and kind.natural_key
            and all(values.get(k) is not None for k in kind.natural_key)
            and not self._parent_is_new(kind, values)
        ):
            conditions = [getattr(kind.model, k) == values[k] for k in kind.natural_key]
            row = self.session.scalars(select(kind.model).where(*conditions)).first()
        if kind.model is Rollout:
            values = self._rollout_source(row, values, client_id)
        row = self._write(kind, row, client_id, values, label=f"{kind_name}[{client_id}]")
        if client_id is not None:
            self.rows[(kind.model, client_id)] = row
        if kind.model is Rollout and row.env_id is not None:
            self.linked_rollouts.append(row)
        return row

    def _parent_is_new(self, kind: _Kind, values: dict[str, Any]) -> bool:
        """Whether the natural key's parent was written by this batch (then no row of this kind
        can carry the key yet, and the lookup is skipped)."""
        for column, (_, parent) in kind.foreign_keys.items():
            if column in kind.natural_key and values.get(column) in self.created_ids.get(
                parent, ()
            ):
                return True
        return False

    def _rollout_source(
        self, row: Rollout | None, values: dict[str, Any], client_id: str | None
    ) -> dict[str, Any]:
        """Infer ``source_type`` from the one parent given, when the record does not name it."""
        if "source_type" in values:
            return values
        current = row.source_type if row is not None else None
        named = [s for s, column in SOURCE_COLUMNS.items() if values.get(column) is not None]
        if len(named) == 1 and named[0] != current:
            values["source_type"] = named[0]
            for source, column in SOURCE_COLUMNS.items():
                if source != named[0]:
                    values.setdefault(column, None)
        elif len(named) > 1:
            raise IngestError(f"rollouts[{client_id}]: more than one of step/eval/baseline given")
        return values

    def _write(
        self, kind: _Kind, row: Any, client_id: str | None, values: dict[str, Any], label: str
    ) -> Any:
        model = kind.model
        has_updated = hasattr(model, "updated_at")
        if row is None:
            missing = [c for c in kind.required if values.get(c) is None]
            if missing:
                raise IngestError(f"{label}: a new record needs {', '.join(missing)}")
            if kind.has_status:
                values.setdefault("status", "pending")
                if hasattr(model, "progress_percent"):
                    values.setdefault("progress_percent", 0.0)
            row = model(**values)
            if client_id is not None:
                row.client_id = client_id
            row.created_at = values.get("created_at") or self.now
            if has_updated:
                row.updated_at = values.get("updated_at") or self.now
            self.session.add(row)
            if kind.has_status:
                self.history.append((kind.entity, row, None))
            return row
        old_status = row.status if kind.has_status else None
        for column, value in values.items():
            setattr(row, column, value)
        if client_id is not None and row.client_id is None:
            row.client_id = client_id
        if has_updated and "updated_at" not in values:
            row.updated_at = self.now
        if kind.has_status and "status" in values and values["status"] != old_status:
            self.history.append((kind.entity, row, old_status))
        return row

    def _history(self, entity: str, row: Any, old_status: str | None) -> None:
        if row.status is None:
            return
        self.session.add(
            StatusHistory(
                entity_type=entity,
                entity_id=row.id,
                old_status=old_status,
                new_status=row.status,
                progress_percent=getattr(row, "progress_percent", None),
                status_message=row.status_message,
                changed_at=self.now,
                created_at=self.now,
            )
        )


class _Progress:
    """Recomputes the progress fields of everything a batch touched, bottom-up."""

    def __init__(self, session: Session, now: datetime) -> None:
        self.session = session
        self.now = now

    def refresh(self, touched: dict[str, set[int]], trainings: set[int]) -> None:
        rollout_ids = set(touched["rollouts"])
        for ids, model in ((touched["turns"], Turn), (touched["environments"], Environment)):
            if ids:
                rollout_ids |= set(
                    self.session.scalars(select(model.rollout_id).where(model.id.in_(ids)))
                )
        steps, evals, baselines = (
            set(touched["steps"]),
            set(touched["evals"]),
            set(touched["baselines"]),
        )
        for rollout in self._rows(Rollout, rollout_ids):
            self._rollout(rollout)
            if rollout.step_id is not None:
                steps.add(rollout.step_id)
            if rollout.eval_id is not None:
                evals.add(rollout.eval_id)
            if rollout.baseline_id is not None:
                baselines.add(rollout.baseline_id)
        trainings = set(trainings)
        for step in self._rows(Step, steps):
            self._step(step)
            trainings.add(step.training_id)
        for eval_model, ids in ((Eval, evals), (Baseline, baselines)):
            for row in self._rows(eval_model, ids):
                self._eval_like(row, eval_model)
        for training in self._rows(Training, trainings):
            self._training(training)
        self.session.flush()

    def _rows(self, model: type[Base], ids: set[int]) -> list[Any]:
        if not ids:
            return []
        return list(self.session.scalars(select(model).where(model.id.in_(ids))))  # type: ignore[attr-defined]

    def _rollout(self, rollout: Rollout) -> None:
        turns = self.session.execute(
            select(func.max(Turn.turn), func.count(Turn.id)).where(Turn.rollout_id == rollout.id)
        ).one()
        last_turn, count = turns
        if last_turn is not None and (
            rollout.current_turn is None or rollout.current_turn < last_turn
        ):
            rollout.current_turn = last_turn
        if rollout.status in TERMINAL_ROLLOUT:
            rollout.progress_percent = 100.0
            if rollout.num_turns is None:
                rollout.num_turns = count
        elif rollout.max_turns and rollout.current_turn:
            rollout.progress_percent = min(100.0, 100.0 * rollout.current_turn / rollout.max_turns)

    def _aggregate(
        self, column: Any, parent_id: int
    ) -> tuple[int, int, int, float | None, float | None, float | None, int]:
        """(rollouts, finished, successes, mean reward, mean squared reward, mean turns,
        rewards) over one parent's rollouts, computed by the database: one indexed query
        whatever the number of rollouts (the batch cost stays flat as a step fills)."""
        done = Rollout.status.in_(TERMINAL_ROLLOUT)
        finished_reward = case((done, Rollout.reward))
        row = self.session.execute(
            select(
                func.count(Rollout.id),
                func.count(case((done, 1))),
                func.count(case((done & (Rollout.task_success == 1), 1))),
                func.avg(finished_reward),
                func.avg(finished_reward * finished_reward),
                func.avg(case((done, Rollout.num_turns))),
                func.count(finished_reward),
            ).where(column == parent_id)
        ).one()
        total, finished, successes, mean, square, turns, rewards = row
        return (
            int(total),
            int(finished),
            int(successes),
            None if mean is None else float(mean),
            None if square is None else float(square),
            None if turns is None else float(turns),
            int(rewards),
        )

    def _groups(self, step_id: int) -> tuple[int, int]:
        """(groups, groups whose rollouts all finished) of a step."""
        key = func.coalesce(Rollout.group_id, func.cast(Rollout.group, String))
        open_ = func.count(case((Rollout.status.not_in(TERMINAL_ROLLOUT), 1)))
        per_group = (
            select(key.label("g"), open_.label("open"))
            .where(Rollout.step_id == step_id)
            .group_by(key)
            .subquery()
        )
        total, complete = self.session.execute(
            select(func.count(), func.count(case((per_group.c.open == 0, 1))))
        ).one()
        return int(total), int(complete)

    def _step(self, step: Step) -> None:
        total, finished, _, mean, square, _, rewards = self._aggregate(Rollout.step_id, step.id)
        groups, completed_groups = self._groups(step.id)
        given = _json_dict(step.rollout_progress)
        total_envs = max(_count(given.get("total_envs")), total)
        step.rollout_progress = json.dumps(
            {
                "completed_groups": completed_groups,
                "total_groups": max(_count(given.get("total_groups")), groups),
                "completed_envs": finished,
                "total_envs": total_envs,
            }
        )
        if rewards and mean is not None and square is not None:
            step.reward_mean = mean
            step.reward_std = max(0.0, square - mean * mean) ** 0.5
            step.num_trajectories = finished
        if step.status == "completed":
            step.progress_percent = 100.0
            return
        training = _json_dict(step.training_progress)
        rollout_part = finished / total_envs if total_envs else 0.0
        substeps = _count(training.get("total_substeps"))
        training_part = _count(training.get("completed_substeps")) / substeps if substeps else 0.0
        step.progress_percent = round(80.0 * rollout_part + 20.0 * min(training_part, 1.0), 3)

    def _eval_like(self, row: Eval | Baseline, model: type[Eval] | type[Baseline]) -> None:
        parent_column = Rollout.eval_id if model is Eval else Rollout.baseline_id
        total, finished, successes, mean, _, turns, _ = self._aggregate(parent_column, row.id)
        if not total:
            return
        row.completed_tasks = finished
        row.total_tasks = max(row.total_tasks or 0, total)
        if finished:
            row.successful_tasks = successes
            row.success_rate = successes / finished
            row.avg_reward = mean
            row.avg_turns = turns
        if row.status == "completed":
            row.progress_percent = 100.0
        elif row.total_tasks:
            row.progress_percent = 100.0 * row.completed_tasks / row.total_tasks

    def _training(self, training: Training) -> None:
        last_step, completed = self.session.execute(
            select(
                func.max(Step.step),
                func.count(Step.id).filter(Step.status == "completed"),
            ).where(Step.training_id == training.id)
        ).one()
        if last_step is not None and (
            training.current_step is None or training.current_step < last_step
        ):
            training.current_step = last_step
        if training.status == "completed":
            training.progress_percent = 100.0
        elif training.total_steps:
            training.progress_percent = min(100.0, 100.0 * completed / training.total_steps)


def _close_children(session: Session, training_id: int, status: str, now: datetime) -> None:
    """A training that failed or was cancelled leaves nothing open: its unfinished steps fail,
    its unfinished evals/baselines and their rollouts take its status, environments end."""
    message = f"training {status}"
    open_steps = Step.status.not_in(("completed", "failed")) | Step.status.is_(None)
    session.execute(
        update(Step)
        .where(Step.training_id == training_id, open_steps)
        .values(status="failed", error_message=message, end_time=now, updated_at=now)
    )
    for model in (Eval, Baseline):
        session.execute(
            update(model)
            .where(
                model.training_id == training_id,
                model.status.not_in(TERMINAL_ROLLOUT) | model.status.is_(None),
            )
            .values(status=status, error_message=message, end_time=now, updated_at=now)
            .execution_options(synchronize_session=False)
        )
    sources = (
        Rollout.step_id.in_(select(Step.id).where(Step.training_id == training_id))
        | Rollout.eval_id.in_(select(Eval.id).where(Eval.training_id == training_id))
        | Rollout.baseline_id.in_(select(Baseline.id).where(Baseline.training_id == training_id))
    )
    open_rollouts = select(Rollout.id).where(
        sources, Rollout.status.not_in(TERMINAL_ROLLOUT) | Rollout.status.is_(None)
    )
    session.execute(
        update(Environment)
        .where(
            Environment.rollout_id.in_(open_rollouts),
            Environment.status.not_in(("terminated", "error")) | Environment.status.is_(None),
        )
        .values(status="terminated", status_message=message, termination_time=now)
        .execution_options(synchronize_session=False)
    )
    session.execute(
        update(Rollout)
        .where(Rollout.id.in_(open_rollouts))
        .values(status=status, error_message=message, end_time=now, updated_at=now)
        .execution_options(synchronize_session=False)
    )


def _count(value: Any) -> int:
    """A non-negative count from a sender's progress JSON; anything else counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if 0 <= value < 2**31 else 0


def _mapping(client_id: str | None, row_id: int) -> dict[str, Any]:
    return {"id": row_id} if client_id is None else {"client_id": client_id, "id": row_id}


def _contract_extras(model: type[Base], values: dict[str, Any]) -> None:
    """Fill the dashboard's columns from where a contract-only sender puts them: the group number
    (``group_num``), a turn's parse error (``metrics_json.parse_error``) and a screenshot's size
    (``model_input_json.width``/``height``)."""
    if model is Rollout and values.get("group_num") is not None:
        values["group"] = values.pop("group_num")
    values.pop("group_num", None)
    if model is Rollout and values.get("group_id") is not None:
        values["group_id"] = str(values["group_id"])
    if model is Turn and "parse_error" not in values:
        parse_error = _json_dict(values.get("metrics_json")).get("parse_error")
        if isinstance(parse_error, str):
            values["parse_error"] = parse_error
    if model is Obs:
        size = _json_dict(values.get("model_input_json"))
        for key in ("width", "height"):
            if key not in values and isinstance(size.get(key), int):
                values[key] = size[key]


def _json_dict(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = ["IngestError", "MonitorStore", "default_sqlite_url", "make_engine"]
