"""Applies one parsed ingest batch inside an open transaction, set-based.

Per kind (parents first, ``ingest.ARRAY_KINDS``): one ``SELECT … WHERE client_id IN (…)`` for the
rows the batch names (its own and its parents'), one for natural keys when needed, then the
records are resolved in memory in the order sent (a later record of the same ``client_id``
updates the pending row) and written as executemany ``INSERT``/``UPDATE`` statements, one per run
of records that set the same columns (psycopg sends an executemany as one pipeline), followed by
one ``SELECT`` for the new rows' ids. Status history rows and rollout → environment back-links are
one executemany each per batch. The upsert semantics are those of ``ingest.py``: only the keys a
record gives are written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Connection, and_, insert, select

from cua_native.monitor.db.bulk import chunks, insert_rows, rows_where_in, update_rows
from cua_native.monitor.db.progress import (
    CLOSED_ENVIRONMENT,
    ENDED_TRAINING,
    TERMINAL_ROLLOUT,
    Progress,
    close_children,
    ended_trainings_of,
    json_dict,
)
from cua_native.monitor.db.schema import (
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
from cua_native.monitor.db.tally import Share, share_of
from cua_native.monitor.ingest import ARRAY_KINDS, IngestBatch, IngestError, TrainingIn
from cua_native.monitor.screenshots import ScreenshotStore, is_data_uri

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
class Kind:
    model: type[Base]
    entity: str
    foreign_keys: dict[str, tuple[str, type[Base]]] = field(default_factory=dict)
    """column → (client-id key in the record, parent model)."""
    natural_key: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    """NOT NULL columns without default: needed when the record creates the row."""
    has_status: bool = False


_TRAINING_FK: dict[str, tuple[str, type[Base]]] = {"training_id": ("training_client_id", Training)}
TRAINING_KIND = Kind(Training, "training", {}, (), ("run_name", "log_path", "model_name"), True)
KINDS: dict[str, Kind] = {
    "tasks": Kind(Task, "task", {}, ("task_id",), ("task_id", "name", "description")),
    "validators": Kind(
        Validator,
        "validator",
        {"task_id": ("task_client_id", Task)},
        (),
        ("task_id", "validator_type"),
    ),
    "baselines": Kind(Baseline, "baseline", _TRAINING_FK, (), ("training_id", "model_path"), True),
    "evals": Kind(
        Eval,
        "eval",
        _TRAINING_FK,
        ("training_id", "step"),
        ("training_id", "step", "model_path"),
        True,
    ),
    "steps": Kind(
        Step, "step", _TRAINING_FK, ("training_id", "step"), ("training_id", "step"), True
    ),
    "rollouts": Kind(
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
    "environments": Kind(
        Environment,
        "environment",
        {"rollout_id": ("rollout_client_id", Rollout)},
        (),
        ("env_type",),
        True,
    ),
    "turns": Kind(
        Turn,
        "turn",
        {"rollout_id": ("rollout_client_id", Rollout)},
        ("rollout_id", "turn"),
        ("rollout_id", "turn"),
    ),
    "actions": Kind(Action, "action", {"turn_id": ("turn_client_id", Turn)}, (), ("turn_id",)),
    "observations": Kind(Obs, "obs", {"turn_id": ("turn_client_id", Turn)}, (), ("turn_id",)),
    "validations": Kind(
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


def to_column(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in JSON_FIELDS:
        return value if isinstance(value, str) else json.dumps(value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


@dataclass(slots=True, eq=False)
class _Row:
    """A row the batch reads or writes: its known column values (all of them for a row read
    from the database, the inserted ones for a new row) and what this batch changes."""

    state: dict[str, Any]
    new: bool
    changes: dict[str, Any] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        """A new row not inserted yet (its values are all in ``state``)."""
        return self.new and "id" not in self.state

    @property
    def id(self) -> int | None:
        value = self.state.get("id")
        return None if value is None else int(value)


@dataclass(slots=True)
class _History:
    entity: str
    row: _Row
    old_status: str | None
    new_status: str
    progress_percent: float | None
    status_message: str | None


class BatchWriter:
    """Applies one parsed batch on ``connection`` (inside its transaction)."""

    def __init__(self, connection: Connection, screenshots: ScreenshotStore) -> None:
        self.connection = connection
        self.screenshots = screenshots
        self.now = utcnow()
        self.rows: dict[tuple[type[Base], str], _Row | None] = {}
        self.created_ids: dict[type[Base], set[int]] = {}
        """Rows this batch inserted, by model (their children cannot be in the database yet)."""
        self.touched: dict[type[Base], set[int]] = {}
        self.touched_rollouts: set[int] = set()
        self.ended_trainings: dict[int, str] = {}
        self.history: list[_History] = []
        self.rollout_before: dict[int, Share | None] = {}
        """Each rollout's share in its step's tallies before this batch (``None``: new), taken
        at its first read, which locks it (``tally.py``)."""

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
        for kind_name, records in plan:
            if not records:
                continue
            written = self._kind(kind_name, [record for _, record in records])
            slots = answer.setdefault(kind_name, [None] * len(getattr(batch, kind_name)))
            for (position, record), row in zip(records, written, strict=True):
                slots[position] = _mapping(record.client_id, _known_id(row))
        self._write_history()
        self._late_rows()
        for training_id, status in self.ended_trainings.items():
            closed = close_children(self.connection, training_id, status, self.now)
            for rollout_id, share in closed.items():
                self.rollout_before.setdefault(rollout_id, share)
        touched = self.touched
        Progress(self.connection, self.now).refresh(
            touched.get(Rollout, set()) | self.touched_rollouts | set(self.rollout_before),
            set(touched.get(Step, ())),
            set(touched.get(Eval, ())),
            set(touched.get(Baseline, ())),
            set(touched.get(Training, ())),
            self.rollout_before,
        )
        return answer

    def _late_rows(self) -> None:
        """An open rollout or environment written after its training ended (a rollout
        worker's rows arrive on their own) closes that training's children again."""
        written = {model: self.touched.get(model, set()) for model in (Rollout, Environment)}
        rollouts: set[int] = set()
        for (model, _), row in self.rows.items():
            if row is None or model not in written or row.id not in written[model]:
                continue
            status = row.state.get("status")
            if model is Rollout and status not in TERMINAL_ROLLOUT:
                rollouts.add(row.id)
            elif model is Environment and status not in CLOSED_ENVIRONMENT:
                if row.state.get("rollout_id") is not None:
                    rollouts.add(row.state["rollout_id"])
        if rollouts:
            ended = ended_trainings_of(self.connection, sorted(rollouts))
            for training_id, status in ended.items():
                self.ended_trainings.setdefault(training_id, status)

    # -- reading -----------------------------------------------------------------------------

    def _prefetch(self, model: type[Base], client_ids: Iterable[str]) -> None:
        """One query for every client id of a model the batch names and has not read yet."""
        wanted = sorted({c for c in client_ids if (model, c) not in self.rows})
        if not wanted:
            return
        table: Any = model.__table__
        lock = model is Rollout
        for found in rows_where_in(self.connection, table, table.c.client_id, wanted, lock=lock):
            self.rows[(model, found.client_id)] = self._read(model, found)
        for client_id in wanted:
            self.rows.setdefault((model, client_id), None)

    def _by_natural_key(
        self, kind: Kind, keys: list[tuple[Any, ...]]
    ) -> dict[tuple[Any, ...], _Row]:
        """Rows of ``kind`` whose natural key is one of ``keys`` (one query per chunk)."""
        table: Any = kind.model.__table__
        found: dict[tuple[Any, ...], _Row] = {}
        for part in chunks(sorted(set(keys), key=repr)):
            conditions = [
                table.c[column].in_({key[i] for key in part})
                for i, column in enumerate(kind.natural_key)
            ]
            wanted = set(part)
            statement = select(table).where(and_(*conditions))
            if kind.model is Rollout:
                statement = statement.order_by(table.c.id).with_for_update(key_share=True)
            for row in self.connection.execute(statement):
                key = tuple(getattr(row, column) for column in kind.natural_key)
                if key in wanted:
                    found[key] = self._read(kind.model, row)
        return found

    def _read(self, model: type[Base], row: Any) -> _Row:
        """A row read from the database; a rollout's share before the batch is noted."""
        state = dict(row._mapping)
        if model is Rollout:
            self.rollout_before.setdefault(state["id"], share_of(state))
        return _Row(state, new=False)

    # -- one kind ----------------------------------------------------------------------------

    def _kind(self, kind_name: str, records: list[BaseModel]) -> list[_Row]:
        kind = KINDS[kind_name]
        model = kind.model
        for client_key, parent in kind.foreign_keys.values():
            self._prefetch(parent, (c for r in records if (c := getattr(r, client_key))))
        self._prefetch(model, (r.client_id for r in records if r.client_id is not None))  # type: ignore[attr-defined]
        prepared = [self._values(kind_name, kind, record) for record in records]
        natural = self._natural_rows(kind, prepared)
        written: list[_Row] = []
        for client_id, values in prepared:
            row = self.rows.get((model, client_id)) if client_id is not None else None
            if row is None and kind.natural_key:
                row = natural.get(tuple(values.get(k) for k in kind.natural_key))
            if model is Rollout:
                values = self._rollout_source(row, values, client_id)
            row = self._write(kind, row, client_id, values, label=f"{kind_name}[{client_id}]")
            if client_id is not None:
                self.rows[(model, client_id)] = row
            written.append(row)
        self._flush(model, written)
        touched = self.touched.setdefault(model, set())
        for row in written:
            touched.add(_known_id(row))
            if model in (Turn, Environment) and row.state.get("rollout_id") is not None:
                self.touched_rollouts.add(row.state["rollout_id"])
        if model is Rollout:
            self._link_environments(written)
        return written

    def _values(
        self, kind_name: str, kind: Kind, record: BaseModel
    ) -> tuple[str | None, dict[str, Any]]:
        """A record's column values, parents resolved to ids."""
        values = record.model_dump(exclude_unset=True)
        client_id: str | None = values.pop("client_id", None)
        for column, (client_key, parent) in kind.foreign_keys.items():
            if client_key not in values:
                continue
            parent_client_id = values.pop(client_key)
            if parent_client_id is None:
                continue
            parent_row = self.rows.get((parent, parent_client_id))
            if parent_row is None:
                raise IngestError(
                    f"{kind_name}[{client_id}]: unknown {client_key} {parent_client_id!r}"
                )
            values[column] = _known_id(parent_row)
        values = {k: to_column(k, v) for k, v in values.items()}
        if kind.model is Obs and is_data_uri(values.get("screenshot_uri") or ""):
            values["screenshot_uri"] = self.screenshots.put_data_uri(values["screenshot_uri"])
        _contract_extras(kind.model, values)
        return client_id, values

    def _natural_rows(
        self, kind: Kind, prepared: list[tuple[str | None, dict[str, Any]]]
    ) -> dict[tuple[Any, ...], _Row]:
        """Rows found by natural key for the records no client id matches (skipped when the
        key's parent was inserted by this batch: no row can carry it yet)."""
        if not kind.natural_key:
            return {}
        keys = []
        for client_id, values in prepared:
            if client_id is not None and self.rows.get((kind.model, client_id)) is not None:
                continue
            key = tuple(values.get(k) for k in kind.natural_key)
            if all(v is not None for v in key) and not self._parent_is_new(kind, values):
                keys.append(key)
        return self._by_natural_key(kind, keys) if keys else {}

    def _parent_is_new(self, kind: Kind, values: dict[str, Any]) -> bool:
        for column, (_, parent) in kind.foreign_keys.items():
            if column in kind.natural_key and values.get(column) in self.created_ids.get(
                parent, ()
            ):
                return True
        return False

    def _rollout_source(
        self, row: _Row | None, values: dict[str, Any], client_id: str | None
    ) -> dict[str, Any]:
        """Infer ``source_type`` from the one parent given, when the record does not name it."""
        if "source_type" in values:
            return values
        current = row.state.get("source_type") if row is not None else None
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
        self,
        kind: Kind,
        row: _Row | None,
        client_id: str | None,
        values: dict[str, Any],
        label: str,
    ) -> _Row:
        """Resolve one record against its row (in memory; ``_flush`` writes)."""
        model: Any = kind.model
        has_updated = hasattr(model, "updated_at")
        if row is None:
            missing = [c for c in kind.required if values.get(c) is None]
            if missing:
                raise IngestError(f"{label}: a new record needs {', '.join(missing)}")
            if kind.has_status:
                values.setdefault("status", "pending")
                if hasattr(model, "progress_percent"):
                    values.setdefault("progress_percent", 0.0)
            if client_id is not None:
                values["client_id"] = client_id
            values["created_at"] = values.get("created_at") or self.now
            if has_updated:
                values["updated_at"] = values.get("updated_at") or self.now
            row = _Row(values, new=True)
            if kind.has_status:
                self._note_status(kind, row, None)
            return row
        old_status = row.state.get("status") if kind.has_status else None
        changes = dict(values)
        if client_id is not None and row.state.get("client_id") is None:
            changes["client_id"] = client_id
        if has_updated and "updated_at" not in values:
            changes["updated_at"] = self.now
        row.state.update(changes)
        if not row.pending:
            row.changes.update(changes)
        if kind.has_status and "status" in values and values["status"] != old_status:
            self._note_status(kind, row, old_status)
        return row

    def _note_status(self, kind: Kind, row: _Row, old_status: str | None) -> None:
        status = row.state.get("status")
        if status is None:
            return
        self.history.append(
            _History(
                kind.entity,
                row,
                old_status,
                status,
                row.state.get("progress_percent"),
                row.state.get("status_message"),
            )
        )

    # -- writing -----------------------------------------------------------------------------

    def _flush(self, model: type[Base], rows: list[_Row]) -> None:
        """Write the batch's new and changed rows of one model; learn the new rows' ids."""
        table: Any = model.__table__
        inserts: list[_Row] = []
        seen: set[int] = set()
        for row in rows:
            if id(row) in seen:
                continue
            seen.add(id(row))
            if row.pending:
                inserts.append(row)
        anonymous = [row for row in inserts if row.state.get("client_id") is None]
        named = [row for row in inserts if row.state.get("client_id") is not None]
        by_client = {row.state["client_id"]: row for row in named}
        defaulted = {c.name for c in table.c if c.server_default is not None}
        for row_id, client_id in insert_rows(
            self.connection, table, [_inserted(r.state, defaulted) for r in named]
        ):
            by_client[client_id].state["id"] = row_id
        for row in anonymous:
            row.state["id"] = self.connection.execute(
                insert(table).values(_inserted(row.state, defaulted)).returning(table.c.id)
            ).scalar_one()
        self.created_ids.setdefault(model, set()).update(_known_id(row) for row in inserts)
        if model is Rollout:
            for row in inserts:
                self.rollout_before.setdefault(_known_id(row), None)
        changed = []
        for row in rows:
            if row.changes:
                changed.append({"row_id": row.id, **row.changes})
                row.changes = {}
        update_rows(self.connection, table, changed)

    def _link_environments(self, rollouts: list[_Row]) -> None:
        """The existing client links rollout → environment; fill environment → rollout too."""
        links = {}
        for rollout in rollouts:
            env_id = rollout.state.get("env_id")
            if env_id is not None:
                links[env_id] = _known_id(rollout)
        if not links:
            return
        for (model, _), row in self.rows.items():
            if model is Environment and row is not None and row.state.get("id") in links:
                if row.state.get("rollout_id") is None:
                    row.state["rollout_id"] = links[row.state["id"]]
        update_rows(
            self.connection,
            Environment.__table__,  # type: ignore[arg-type]
            [{"row_id": env, "rollout_id": rollout} for env, rollout in links.items()],
            only_null="rollout_id",
        )

    def _write_history(self) -> None:
        if not self.history:
            return
        insert_rows(
            self.connection,
            StatusHistory.__table__,  # type: ignore[arg-type]
            [
                {
                    "entity_type": h.entity,
                    "entity_id": _known_id(h.row),
                    "old_status": h.old_status,
                    "new_status": h.new_status,
                    "progress_percent": h.progress_percent,
                    "status_message": h.status_message,
                    "changed_at": self.now,
                    "created_at": self.now,
                }
                for h in self.history
            ],
        )
        self.history.clear()

    # -- the training ------------------------------------------------------------------------

    def _training(self, record: TrainingIn) -> int:
        values = {k: to_column(k, v) for k, v in record.given().items()}
        training_id = values.pop("training_id", None)
        client_id = values.pop("client_id", None)
        table: Any = Training.__table__
        row: _Row | None = None
        if training_id is not None:
            found = (
                self.connection.execute(select(table).where(table.c.id == training_id)).first()
                if abs(training_id) < 2**31
                else None
            )
            if found is None:
                raise IngestError(f"training: unknown training_id {training_id}")
            row = _Row(dict(found._mapping), new=False)
            run_name = values.get("run_name")
            if run_name is not None and row.state["run_name"] != run_name:
                raise IngestError(
                    f"training: training_id {training_id} is run {row.state['run_name']!r}, "
                    f"not {run_name!r}"
                )
        if row is None and client_id is not None:
            self._prefetch(Training, [client_id])
            row = self.rows[(Training, client_id)]
        if row is None and values.get("run_name") is not None:
            found = self.connection.execute(
                select(table).where(table.c.run_name == values["run_name"])
            ).first()
            row = None if found is None else _Row(dict(found._mapping), new=False)
        if row is None:
            values = TRAINING_DEFAULTS | values
        before = row.state.get("status") if row is not None else None
        row = self._write(
            TRAINING_KIND, row, client_id, values, label=client_id or str(training_id)
        )
        self._flush(Training, [row])
        self._write_history()
        training_row_id = _known_id(row)
        self.touched.setdefault(Training, set()).add(training_row_id)
        if row.state.get("client_id") is not None:
            self.rows[(Training, row.state["client_id"])] = row
        status = row.state.get("status")
        if status in ENDED_TRAINING and status != before:
            self.ended_trainings[training_row_id] = status
        return training_row_id


def _inserted(state: dict[str, Any], defaulted: set[str]) -> dict[str, Any]:
    """The values an INSERT sends: a None where the column has a server default is left out,
    so the default applies (as the ORM did)."""
    return {k: v for k, v in state.items() if v is not None or k not in defaulted}


def _known_id(row: _Row | None) -> int:
    if row is None or row.id is None:
        raise IngestError("internal: a row has no id after its flush")
    return row.id


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
        parse_error = json_dict(values.get("metrics_json")).get("parse_error")
        if isinstance(parse_error, str):
            values["parse_error"] = parse_error
    if model is Obs:
        size = json_dict(values.get("model_input_json"))
        for key in ("width", "height"):
            if key not in values and isinstance(size.get(key), int):
                values[key] = size[key]
