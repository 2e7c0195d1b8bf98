"""A step's figures kept as running tallies, so a batch costs the same whatever the step's size.

What one rollout contributes to its step (``Share``): one rollout; one finished rollout when its
status is terminal; its reward and squared reward when it is finished with a reward; one rollout
of its group, an open one while its status is set and not terminal. The step row keeps the sums
(``step.tally_*``) and ``step_group`` the per-group counts; a batch adds, for every rollout it
changed, its share after the batch minus its share before. The figures are those the store used
to aggregate over all the step's rollouts on every batch (``tests/monitor/db`` compares them
with that aggregate after random batches).

Correct with concurrent writers (PostgreSQL, READ COMMITTED) because:

- a rollout's share before the batch is read under its row lock (``FOR NO KEY UPDATE`` in the
  writer's reads, held to commit), so no other transaction changes it between that read and this
  batch's write; its share after is read back from the database once the batch is written;
- a step's tallies are read under the step row's lock and written in the same transaction, and
  its groups' counters are changed only while that lock is held;
- locks are taken rollouts → steps → groups, each set in key order, by a batch of rollouts and
  by a training's close; a batch that also updates step rows locks those steps before its
  rollouts, so two writers can still deadlock. PostgreSQL then aborts one transaction and the
  store applies that batch again (``MonitorStore.ingest``); nothing is half-written.

SQLite has one writer at a time (the store begins its ingest transactions ``IMMEDIATE``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, RowMapping
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from cua_native.monitor.db.bulk import chunks
from cua_native.monitor.db.schema import Rollout, StepGroup

TERMINAL_ROLLOUT = ("completed", "failed", "cancelled", "interrupted")
SHARE_COLUMNS = tuple(
    Rollout.__table__.c[name]
    for name in ("source_type", "step_id", "status", "reward", "group_id", "group")
)
"""The rollout columns a share depends on."""
NO_GROUP = "-"
GROUP_ROWS_PER_STATEMENT = 1000


def group_key(group_id: Any, group: Any) -> str:
    """A rollout's group within its step: its ``group_id``, else its ``group`` number (the two
    are one key space, as ``COALESCE(group_id, CAST("group" AS TEXT))``); ``-`` for neither."""
    if group_id is not None:
        return f"g:{group_id}"
    if group is not None:
        return f"g:{group}"
    return NO_GROUP


@dataclass(frozen=True, slots=True)
class Share:
    """One rollout's part in its step's tallies."""

    step_id: int
    group: str
    finished: bool
    open: bool
    reward: float | None
    """Counted only for a finished rollout."""


def share_of(row: Mapping[str, Any] | RowMapping) -> Share | None:
    """The share of a rollout row (its ``SHARE_COLUMNS``); ``None`` outside a step."""
    if row.get("source_type") != "step" or row.get("step_id") is None:
        return None
    status = row.get("status")
    finished = status in TERMINAL_ROLLOUT
    reward = row.get("reward") if finished else None
    return Share(
        step_id=int(row["step_id"]),
        group=group_key(row.get("group_id"), row.get("group")),
        finished=finished,
        open=status is not None and not finished,
        reward=None if reward is None else float(reward),
    )


@dataclass(slots=True)
class StepChange:
    """How much one batch changes a step's tallies."""

    rollouts: int = 0
    finished: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    reward_squares: float = 0.0
    groups: int = 0
    complete_groups: int = 0

    def tallies(self, step: Mapping[str, Any]) -> dict[str, Any]:
        """The step row's ``tally_*`` values after this change (sums reset to 0 with the count,
        so no rounding residue outlives the rewards it came from)."""
        rewarded = step["tally_rewarded"] + self.rewarded
        return {
            "tally_rollouts": step["tally_rollouts"] + self.rollouts,
            "tally_finished": step["tally_finished"] + self.finished,
            "tally_rewarded": rewarded,
            "tally_reward_sum": step["tally_reward_sum"] + self.reward_sum if rewarded else 0.0,
            "tally_reward_squares": (
                step["tally_reward_squares"] + self.reward_squares if rewarded else 0.0
            ),
            "tally_groups": step["tally_groups"] + self.groups,
            "tally_complete_groups": step["tally_complete_groups"] + self.complete_groups,
        }


class Tally:
    """The changes one batch makes to its steps' tallies and to their groups' counters."""

    def __init__(self) -> None:
        self.steps: dict[int, StepChange] = {}
        self.groups: dict[tuple[int, str], list[int]] = {}
        """(step, group) → [change in rollouts, change in open rollouts]."""

    def change(self, before: Share | None, after: Share | None) -> None:
        if before != after:
            self._add(before, -1)
            self._add(after, 1)

    def _add(self, share: Share | None, sign: int) -> None:
        if share is None:
            return
        step = self.steps.setdefault(share.step_id, StepChange())
        step.rollouts += sign
        step.finished += sign * share.finished
        if share.reward is not None:
            step.rewarded += sign
            step.reward_sum += sign * share.reward
            step.reward_squares += sign * share.reward * share.reward
        group = self.groups.setdefault((share.step_id, share.group), [0, 0])
        group[0] += sign
        group[1] += sign * share.open

    def write_groups(self, connection: Connection) -> None:
        """Add the group changes to ``step_group`` and count, into ``steps``, the groups that
        appear or empty and those that become complete (all rollouts finished) or open again.
        Call it with the steps' rows locked."""
        rows = [
            {"step_id": step, "group_key": key, "rollouts": added, "open_rollouts": opened}
            for (step, key), (added, opened) in sorted(self.groups.items())
            if added or opened
        ]
        for part in chunks(rows, GROUP_ROWS_PER_STATEMENT):
            for step, key, rollouts, open_rollouts in _upsert(connection, part):
                added, opened = self.groups[(step, key)]
                before = (rollouts - added, open_rollouts - opened)
                change = self.steps.setdefault(step, StepChange())
                change.groups += _exists(rollouts, open_rollouts) - _exists(*before)
                change.complete_groups += _complete(rollouts, open_rollouts) - _complete(*before)


def _upsert(connection: Connection, rows: list[dict[str, Any]]) -> Iterable[Any]:
    """``INSERT … ON CONFLICT (step_id, group_key) DO UPDATE`` adding the counts; answers each
    group's counts after it (PostgreSQL and SQLite ≥ 3.35 have the same syntax)."""
    insert = postgres_insert if connection.dialect.name == "postgresql" else sqlite_insert
    table: Any = StepGroup.__table__
    values = insert(table).values(rows)
    statement = values.on_conflict_do_update(
        index_elements=[table.c.step_id, table.c.group_key],
        set_={
            "rollouts": table.c.rollouts + values.excluded.rollouts,
            "open_rollouts": table.c.open_rollouts + values.excluded.open_rollouts,
        },
    ).returning(table.c.step_id, table.c.group_key, table.c.rollouts, table.c.open_rollouts)
    return connection.execute(statement).all()


def _exists(rollouts: int, _open: int) -> int:
    return int(rollouts > 0)


def _complete(rollouts: int, open_rollouts: int) -> int:
    return int(rollouts > 0 and open_rollouts == 0)
