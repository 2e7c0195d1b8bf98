"""A step's running tallies of its rollouts (``step.tally_*``) and per-group counters
(``step_group``), kept by the store so a batch's cost does not grow with the step (``tally.py``).

Adds columns and a table, then fills them from the rollouts already stored (the same figures
the store computed by aggregating a step's rollouts before this revision).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INTEGER_TALLIES = (
    "tally_rollouts",
    "tally_finished",
    "tally_rewarded",
    "tally_groups",
    "tally_complete_groups",
)
FLOAT_TALLIES = ("tally_reward_sum", "tally_reward_squares")
FINISHED = "status IN ('completed', 'failed', 'cancelled')"
OF_STEP = "r.source_type = 'step' AND r.step_id = step.id"

FILL_GROUPS = f"""
INSERT INTO step_group (step_id, group_key, rollouts, open_rollouts)
SELECT step_id, group_key, COUNT(*),
       COUNT(CASE WHEN status IS NOT NULL AND NOT ({FINISHED}) THEN 1 END)
FROM (
    SELECT step_id, status,
           CASE WHEN group_id IS NOT NULL THEN 'g:' || group_id
                WHEN "group" IS NOT NULL THEN 'g:' || CAST("group" AS VARCHAR)
                ELSE '-' END AS group_key
    FROM rollout
    WHERE source_type = 'step' AND step_id IS NOT NULL
) AS keyed
GROUP BY step_id, group_key
"""
FILL_STEPS = f"""
UPDATE step SET
    tally_rollouts = (SELECT COUNT(*) FROM rollout r WHERE {OF_STEP}),
    tally_finished = (SELECT COUNT(*) FROM rollout r WHERE {OF_STEP} AND r.{FINISHED}),
    tally_rewarded = (
        SELECT COUNT(r.reward) FROM rollout r WHERE {OF_STEP} AND r.{FINISHED}
    ),
    tally_reward_sum = COALESCE(
        (SELECT SUM(r.reward) FROM rollout r WHERE {OF_STEP} AND r.{FINISHED}), 0
    ),
    tally_reward_squares = COALESCE(
        (SELECT SUM(r.reward * r.reward) FROM rollout r WHERE {OF_STEP} AND r.{FINISHED}), 0
    ),
    tally_groups = (
        SELECT COUNT(*) FROM step_group g WHERE g.step_id = step.id AND g.rollouts > 0
    ),
    tally_complete_groups = (
        SELECT COUNT(*) FROM step_group g
        WHERE g.step_id = step.id AND g.rollouts > 0 AND g.open_rollouts = 0
    )
"""


def _tally(name: str, kind: sa.types.TypeEngine[Any]) -> sa.Column[Any]:
    return sa.Column(name, kind, nullable=False, server_default=sa.text("0"))


def upgrade() -> None:
    with op.batch_alter_table("step") as batch:
        for name in INTEGER_TALLIES:
            batch.add_column(_tally(name, sa.Integer()))
        for name in FLOAT_TALLIES:
            batch.add_column(_tally(name, sa.Float()))
    op.create_table(
        "step_group",
        sa.Column("step_id", sa.Integer(), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        _tally("rollouts", sa.Integer()),
        _tally("open_rollouts", sa.Integer()),
        sa.ForeignKeyConstraint(["step_id"], ["step.id"]),
        sa.PrimaryKeyConstraint("step_id", "group_key"),
    )
    op.execute(FILL_GROUPS)
    op.execute(FILL_STEPS)


def downgrade() -> None:
    op.drop_table("step_group")
    with op.batch_alter_table("step") as batch:
        for name in (*INTEGER_TALLIES, *FLOAT_TALLIES):
            batch.drop_column(name)
