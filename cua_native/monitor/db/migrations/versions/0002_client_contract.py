"""The existing Training Monitor client's keys the seed schema lacks (see ``schema.py``).

Adds columns only (nothing is dropped or rewritten); ``environment.rollout_id`` becomes nullable
because that client posts an environment before the rollout that links to it.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TIMINGS = ("avg_turn_time", "estimated_total_time", "estimated_remaining_time")
TEXT_COLUMNS: dict[str, tuple[str, ...]] = {
    "training": ("experiment_name", "trial_name"),
    "task": ("instruction",),
    "rollout": ("gbox_run_id", "gbox_base_url", "trajectory_data_json"),
    "turn": ("text", "screen_before", "screen_after", "action_json", "model_specific_input_json"),
    "action": ("action_name", "action_args", "action_call_id", "action_json"),
    "validation": ("screenshot_uri",),
}
TIMED = ("training", "step", "baseline", "eval")


def upgrade() -> None:
    for table, columns in TEXT_COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.add_column(sa.Column(column, sa.Text(), nullable=True))
    for table in TIMED:
        with op.batch_alter_table(table) as batch:
            for column in TIMINGS:
                batch.add_column(sa.Column(column, sa.Float(), nullable=True))
    with op.batch_alter_table("rollout") as batch:
        batch.add_column(sa.Column("env_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_rollout_env_id", "environment", ["env_id"], ["id"])
    with op.batch_alter_table("environment") as batch:
        batch.alter_column("rollout_id", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("environment") as batch:
        batch.alter_column("rollout_id", existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table("rollout") as batch:
        batch.drop_constraint("fk_rollout_env_id", type_="foreignkey")
        batch.drop_column("env_id")
    for table in TIMED:
        with op.batch_alter_table(table) as batch:
            for column in TIMINGS:
                batch.drop_column(column)
    for table, columns in TEXT_COLUMNS.items():
        with op.batch_alter_table(table) as batch:
            for column in columns:
                batch.drop_column(column)
