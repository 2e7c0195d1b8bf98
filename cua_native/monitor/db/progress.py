"""Derived fields of the monitor store, brought up to date after each batch.

A step's figures come from its running tallies (``tally.py``): the batch's rollouts' shares
before and after, so the cost is the batch's, not the step's. Rollouts' turn counts are one
query (and at most one UPDATE) for all the rollouts a batch touched; an eval's or baseline's
figures one aggregate over its rollouts on the ``(source_type, <source>_id)`` index (their size is
the evaluation set's). Closing an ended training's children is a handful of ``UPDATE … WHERE``
statements, whose rollouts' shares go through the same tallies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, case, func, select, union, update

from cua_native.monitor.db.bulk import rows_where_in, update_rows, where_in
from cua_native.monitor.db.schema import (
    Baseline,
    Environment,
    Eval,
    Rollout,
    Step,
    Training,
    Turn,
)
from cua_native.monitor.db.tally import (
    SHARE_COLUMNS,
    TERMINAL_ROLLOUT,
    Share,
    StepChange,
    Tally,
    share_of,
)

__all__ = [
    "CLOSED_ENVIRONMENT",
    "ENDED_TRAINING",
    "TERMINAL_ROLLOUT",
    "Progress",
    "close_children",
    "ended_trainings_of",
]


class Progress:
    """Recomputes the progress fields of everything a batch touched, bottom-up."""

    def __init__(self, connection: Connection, now: datetime) -> None:
        self.connection = connection
        self.now = now

    def refresh(
        self,
        rollout_ids: set[int],
        steps: set[int],
        evals: set[int],
        baselines: set[int],
        trainings: set[int],
        before: dict[int, Share | None],
    ) -> None:
        """Refresh rollouts, then the steps/evals/baselines they and the batch name, then the
        trainings the batch names or whose steps it wrote (a training's figures come from its
        steps' numbers and statuses, which only a step record changes).

        ``before`` holds the share (``tally.share_of``) of every rollout the batch changed as it
        was before the batch (``None`` for a new one), read under the rollout's row lock;
        ``rollout_ids`` must include all of them."""
        written_steps = set(steps)
        tally = Tally()
        for step_id, eval_id, baseline_id in self._rollouts(rollout_ids, before, tally):
            if step_id is not None:
                steps.add(step_id)
            if eval_id is not None:
                evals.add(eval_id)
            if baseline_id is not None:
                baselines.add(baseline_id)
        steps.update(tally.steps)
        # lock order: rollouts (the writer's reads), then steps, then their groups
        step_rows = self._rows(Step, steps, lock=True)
        tally.write_groups(self.connection)
        for step in step_rows:
            self._step(step, tally.steps.get(step["id"], StepChange()))
            if step["id"] in written_steps:
                trainings.add(step["training_id"])
        for model, ids in ((Eval, evals), (Baseline, baselines)):
            for row in self._rows(model, ids):
                self._eval_like(row, model)
        for training in self._rows(Training, trainings):
            self._training(training)

    def _rows(self, model: Any, ids: set[int], lock: bool = False) -> list[dict[str, Any]]:
        table = model.__table__
        found = rows_where_in(self.connection, table, table.c.id, sorted(ids), lock=lock)
        return [dict(row._mapping) for row in found]

    def _rollouts(
        self, ids: set[int], before: dict[int, Share | None], tally: Tally
    ) -> list[tuple[int | None, int | None, int | None]]:
        """Current turn, progress and turn count of every touched rollout (one query, their turns
        counted by correlated subqueries on the (rollout_id, turn) index; one UPDATE); their
        shares' changes into ``tally``; answers their parents."""
        table: Any = Rollout.__table__
        wanted = sorted(ids)
        last_turn = (
            select(func.max(Turn.turn)).where(Turn.rollout_id == table.c.id).scalar_subquery()
        )
        turn_count = (
            select(func.count(Turn.id)).where(Turn.rollout_id == table.c.id).scalar_subquery()
        )
        found = rows_where_in(
            self.connection,
            table,
            table.c.id,
            wanted,
            [
                table.c.id,
                table.c.current_turn,
                table.c.num_turns,
                table.c.max_turns,
                table.c.progress_percent,
                table.c.eval_id,
                table.c.baseline_id,
                *SHARE_COLUMNS,
                last_turn.label("last_turn"),
                turn_count.label("turn_count"),
            ],
        )
        parents: list[tuple[int | None, int | None, int | None]] = []
        changes: list[dict[str, Any]] = []
        for row in found:
            parents.append((row.step_id, row.eval_id, row.baseline_id))
            if row.id in before:
                tally.change(before[row.id], share_of(row._mapping))
            last_turn, count = row.last_turn, row.turn_count
            current, done, percent = row.current_turn, row.num_turns, row.progress_percent
            if last_turn is not None and (current is None or current < last_turn):
                current = last_turn
            if row.status in TERMINAL_ROLLOUT:
                percent = 100.0
                if done is None:
                    done = count
            elif row.max_turns and current:
                percent = min(100.0, 100.0 * current / row.max_turns)
            if (current, done, percent) != (row.current_turn, row.num_turns, row.progress_percent):
                changes.append(
                    {
                        "row_id": row.id,
                        "current_turn": current,
                        "num_turns": done,
                        "progress_percent": percent,
                    }
                )
        update_rows(self.connection, table, changes)
        return parents

    def _aggregate(
        self, source: str, parent_id: int
    ) -> tuple[int, int, int, float | None, float | None, float | None, int]:
        """(rollouts, finished, successes, mean reward, mean squared reward, mean turns,
        rewards) over one parent's rollouts (``source`` is ``step``, ``eval`` or ``baseline``),
        computed by the database in one query on the ``(source_type, <source>_id)`` index."""
        done = Rollout.status.in_(TERMINAL_ROLLOUT)
        finished_reward = case((done, Rollout.reward))
        row = self.connection.execute(
            select(
                func.count(Rollout.id),
                func.count(case((done, 1))),
                func.count(case((done & (Rollout.task_success == 1), 1))),
                func.avg(finished_reward),
                func.avg(finished_reward * finished_reward),
                func.avg(case((done, Rollout.num_turns))),
                func.count(finished_reward),
            ).where(of_source(source, parent_id))
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

    def _step(self, step: dict[str, Any], change: StepChange) -> None:
        tallies = change.tallies(step)
        total, finished = tallies["tally_rollouts"], tallies["tally_finished"]
        rewards = tallies["tally_rewarded"]
        groups, completed_groups = tallies["tally_groups"], tallies["tally_complete_groups"]
        given = json_dict(step["rollout_progress"])
        total_envs = max(count_of(given.get("total_envs")), total)
        values: dict[str, Any] = {
            **tallies,
            "rollout_progress": json.dumps(
                {
                    "completed_groups": completed_groups,
                    "total_groups": max(count_of(given.get("total_groups")), groups),
                    "completed_envs": finished,
                    "total_envs": total_envs,
                }
            ),
        }
        if rewards:
            mean = tallies["tally_reward_sum"] / rewards
            square = tallies["tally_reward_squares"] / rewards
            values["reward_mean"] = mean
            values["reward_std"] = max(0.0, square - mean * mean) ** 0.5
            values["num_trajectories"] = finished
        if step["status"] == "completed":
            values["progress_percent"] = 100.0
        else:
            training = json_dict(step["training_progress"])
            rollout_part = finished / total_envs if total_envs else 0.0
            substeps = count_of(training.get("total_substeps"))
            done = count_of(training.get("completed_substeps"))
            training_part = done / substeps if substeps else 0.0
            values["progress_percent"] = round(
                80.0 * rollout_part + 20.0 * min(training_part, 1.0), 3
            )
        self._set(Step, step, values)

    def _eval_like(self, row: dict[str, Any], model: type[Eval] | type[Baseline]) -> None:
        figures = self._aggregate("eval" if model is Eval else "baseline", row["id"])
        total, finished, successes, mean, _, turns, _ = figures
        if not total:
            return
        total_tasks = max(row["total_tasks"] or 0, total)
        values: dict[str, Any] = {"completed_tasks": finished, "total_tasks": total_tasks}
        if finished:
            values["successful_tasks"] = successes
            values["success_rate"] = successes / finished
            values["avg_reward"] = mean
            values["avg_turns"] = turns
        if row["status"] == "completed":
            values["progress_percent"] = 100.0
        elif total_tasks:
            values["progress_percent"] = 100.0 * finished / total_tasks
        self._set(model, row, values)

    def _training(self, training: dict[str, Any]) -> None:
        last_step, completed = self.connection.execute(
            select(
                func.max(Step.step),
                func.count(Step.id).filter(Step.status == "completed"),
            ).where(Step.training_id == training["id"])
        ).one()
        values: dict[str, Any] = {}
        current = training["current_step"]
        if last_step is not None and (current is None or current < last_step):
            values["current_step"] = last_step
        if training["status"] == "completed":
            values["progress_percent"] = 100.0
        elif training["total_steps"]:
            values["progress_percent"] = min(100.0, 100.0 * completed / training["total_steps"])
        self._set(Training, training, values)

    def _set(self, model: Any, row: dict[str, Any], values: dict[str, Any]) -> None:
        """Write the values that differ from the row (nothing when none does)."""
        changed = {k: v for k, v in values.items() if row.get(k) != v}
        if changed:
            table = model.__table__
            self.connection.execute(update(table).where(table.c.id == row["id"]).values(changed))


ENDED_TRAINING = ("completed", "failed", "cancelled", "interrupted")
CLOSED_ENVIRONMENT = ("terminated", "error", "interrupted")
OPEN_ENVIRONMENT = Environment.status.not_in(CLOSED_ENVIRONMENT) | Environment.status.is_(None)


UNTRAINED_STEP = ("pending", "rollout_collecting", "rollout_running")
"""Step statuses before the update: a step still in one when its training ends never trained."""


@dataclass(frozen=True, slots=True)
class Closing:
    """How the open children of a training that ended are closed."""

    steps: Any
    """Which open steps close (a condition on ``Step.status``)."""
    step_status: str
    step_message: str
    status: str
    """The status of its open rollouts, evals and baselines."""
    message: str


def closing(status: str) -> Closing:
    """Steps have no ``cancelled`` in their status machine: one that never trained is
    ``failed``, its message says why. When the training completed, only steps that never
    reached their update close (one in ``training`` may have trained: its own end tells), and
    its open rollouts, evals and baselines are ``cancelled`` (rollouts generated for a step
    that never trained, as AReaL generates ahead, were never trained on)."""
    if status == "completed":
        return Closing(
            Step.status.in_(UNTRAINED_STEP) | Step.status.is_(None),
            "failed",
            "never trained: the training completed before this step's update",
            "cancelled",
            "still open when the training completed",
        )
    message = f"training {status}"
    steps = Step.status.not_in(("completed", "failed")) | Step.status.is_(None)
    return Closing(steps, "failed", message, status, message)


def close_children(
    connection: Connection, training_id: int, status: str, now: datetime
) -> dict[int, Share | None]:
    """A training that ended (``ENDED_TRAINING``) leaves nothing open: its unfinished steps
    fail, its unfinished evals, baselines and rollouts take the status ``closing`` gives,
    every environment of its rollouts still open ends (``terminated``). Called when the end
    arrives and again whenever a later batch writes an open row of that training (a rollout
    worker's rows may arrive after the trainer's end). Answers the shares (before) of the
    rollouts it closed, read under their row locks, for ``Progress.refresh``."""
    how = closing(status)
    sources = (
        Rollout.step_id.in_(select(Step.id).where(Step.training_id == training_id))
        | Rollout.eval_id.in_(select(Eval.id).where(Eval.training_id == training_id))
        | Rollout.baseline_id.in_(select(Baseline.id).where(Baseline.training_id == training_id))
    )
    # rollouts locked first, then steps: the order every ingest takes (``tally.py``)
    open_rollouts = connection.execute(
        select(Rollout.id, *SHARE_COLUMNS)
        .where(sources, Rollout.status.not_in(TERMINAL_ROLLOUT) | Rollout.status.is_(None))
        .order_by(Rollout.id)
        .with_for_update(key_share=True)
    ).all()
    connection.execute(
        update(Step)
        .where(Step.training_id == training_id, how.steps)
        .values(
            status=how.step_status, error_message=how.step_message, end_time=now, updated_at=now
        )
    )
    for model in (Eval, Baseline):
        connection.execute(
            update(model)
            .where(
                model.training_id == training_id,
                model.status.not_in(TERMINAL_ROLLOUT) | model.status.is_(None),
            )
            .values(status=how.status, error_message=how.message, end_time=now, updated_at=now)
        )
    connection.execute(
        update(Environment)
        .where(Environment.rollout_id.in_(select(Rollout.id).where(sources)), OPEN_ENVIRONMENT)
        .values(status="terminated", status_message=how.message, termination_time=now)
    )
    ids = [row.id for row in open_rollouts]
    for condition in where_in(connection, Rollout.id, ids):
        connection.execute(
            update(Rollout)
            .where(condition)
            .values(status=how.status, error_message=how.message, end_time=now, updated_at=now)
        )
    return {row.id: share_of(row._mapping) for row in open_rollouts}


def ended_trainings_of(connection: Connection, rollout_ids: list[int]) -> dict[int, str]:
    """The ended trainings of these rollouts (id → status): a batch that wrote an open row of
    one closes it again (``close_children``). One statement over the batch's rollouts, by
    primary keys."""
    parents = ((Step, Rollout.step_id), (Eval, Rollout.eval_id), (Baseline, Rollout.baseline_id))
    found: dict[int, str] = {}
    for condition in where_in(connection, Rollout.id, rollout_ids):
        query = union(
            *(
                select(Training.id, Training.status)
                .join(parent, parent.training_id == Training.id)
                .join(Rollout, column == parent.id)
                .where(condition, Training.status.in_(ENDED_TRAINING))
                for parent, column in parents
            )
        )
        found.update({row.id: row.status for row in connection.execute(query)})
    return found


def of_source(source: str, parent_id: int) -> Any:
    """The rollouts of one step, eval or baseline, said so that the ``(source_type, <source>_id)``
    index serves it (the schema's check constraint makes ``<source>_id IS NOT NULL`` imply
    ``source_type = <source>``, so the first term selects nothing more or less; without it
    PostgreSQL scans the whole rollout table, a cost that grows with every rollout stored)."""
    column = {"step": Rollout.step_id, "eval": Rollout.eval_id, "baseline": Rollout.baseline_id}
    return (Rollout.source_type == source) & (column[source] == parent_id)


def count_of(value: Any) -> int:
    """A non-negative count from a sender's progress JSON; anything else counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if 0 <= value < 2**31 else 0


def json_dict(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
