"""Initial schema: the 13 seed tables with their defaults, uniques, indexes and the
rollout source CHECK (see ``cua_native/monitor/schema.py``).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "status_history",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("entity_type", sa.Text(), nullable=False),
        sa.Column("entity_id", sa.Integer(), nullable=False),
        sa.Column("old_status", sa.Text(), nullable=True),
        sa.Column("new_status", sa.Text(), nullable=False),
        sa.Column("progress_percent", sa.Float(), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("metadata_json", sa.Text(), nullable=True),
        sa.Column(
            "changed_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=False
        ),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_status_history_entity", "status_history", ["entity_type", "entity_id"], unique=False
    )
    op.create_index(
        "ix_status_history_entity_time",
        "status_history",
        ["entity_type", "entity_id", "changed_at"],
        unique=False,
    )

    op.create_table(
        "task",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("difficulty", sa.Text(), nullable=True),
        sa.Column("category", sa.Text(), nullable=True),
        sa.Column("max_steps", sa.Integer(), nullable=True),
        sa.Column("validation_type", sa.Text(), nullable=True),
        sa.Column("validation_query", sa.Text(), nullable=True),
        sa.Column("expected_result", sa.Text(), nullable=True),
        sa.Column("tags", sa.Text(), nullable=True),
        sa.Column("prerequisites", sa.Text(), nullable=True),
        sa.Column("app_name", sa.Text(), nullable=True),
        sa.Column("source_type", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.Column(
            "updated_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
        sa.UniqueConstraint("task_id"),
    )
    op.create_index("ix_task_task_id", "task", ["task_id"], unique=False)

    op.create_table(
        "training",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("run_name", sa.Text(), nullable=False),
        sa.Column("log_path", sa.Text(), nullable=False),
        sa.Column("model_name", sa.Text(), nullable=False),
        sa.Column("lora_rank", sa.Integer(), nullable=True),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("group_size", sa.Integer(), nullable=True),
        sa.Column("groups_per_batch", sa.Integer(), nullable=True),
        sa.Column("max_tokens", sa.Integer(), nullable=True),
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("kl_penalty_coef", sa.Float(), nullable=True),
        sa.Column("num_substeps", sa.Integer(), nullable=True),
        sa.Column("max_turns", sa.Integer(), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("box_type", sa.Text(), nullable=True),
        sa.Column("renderer_name", sa.Text(), nullable=True),
        sa.Column("wandb_project", sa.Text(), nullable=True),
        sa.Column("wandb_name", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=True),
        sa.Column("progress_percent", sa.Float(), server_default=sa.text("0.0"), nullable=True),
        sa.Column("current_step", sa.Integer(), nullable=True),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("current_phase", sa.Text(), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("start_time", sa.DateTime(), nullable=True),
        sa.Column("end_time", sa.DateTime(), nullable=True),
        sa.Column(
            "last_heartbeat",
            sa.DateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=True,
        ),
        sa.Column("config_json", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.Column(
            "updated_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
        sa.UniqueConstraint("run_name"),
    )
    op.create_index("ix_training_run_name", "training", ["run_name"], unique=False)
    op.create_index("ix_training_status", "training", ["status"], unique=False)
    op.create_index(
        "ix_training_status_heartbeat", "training", ["status", "last_heartbeat"], unique=False
    )

    op.create_table(
        "baseline",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("training_id", sa.Integer(), nullable=False),
        sa.Column("model_path", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=True),
        sa.Column("progress_percent", sa.Float(), server_default=sa.text("0.0"), nullable=True),
        sa.Column("current_task_index", sa.Integer(), nullable=True),
        sa.Column("total_tasks", sa.Integer(), nullable=True),
        sa.Column("completed_tasks", sa.Integer(), nullable=True),
        sa.Column("current_phase", sa.Text(), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("start_time", sa.DateTime(), nullable=True),
        sa.Column("end_time", sa.DateTime(), nullable=True),
        sa.Column("eval_time", sa.DateTime(), nullable=True),
        sa.Column("success_rate", sa.Float(), nullable=True),
        sa.Column("avg_reward", sa.Float(), nullable=True),
        sa.Column("avg_turns", sa.Float(), nullable=True),
        sa.Column("successful_tasks", sa.Integer(), nullable=True),
        sa.Column("metrics_json", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.Column(
            "updated_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["training_id"],
            ["training.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
    )
    op.create_index("ix_baseline_status", "baseline", ["status"], unique=False)
    op.create_index("ix_baseline_training_id", "baseline", ["training_id"], unique=False)

    op.create_table(
        "eval",
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("training_id", sa.Integer(), nullable=False),
        sa.Column("model_path", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=True),
        sa.Column("progress_percent", sa.Float(), server_default=sa.text("0.0"), nullable=True),
        sa.Column("current_task_index", sa.Integer(), nullable=True),
        sa.Column("total_tasks", sa.Integer(), nullable=True),
        sa.Column("completed_tasks", sa.Integer(), nullable=True),
        sa.Column("current_phase", sa.Text(), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("start_time", sa.DateTime(), nullable=True),
        sa.Column("end_time", sa.DateTime(), nullable=True),
        sa.Column("eval_time", sa.DateTime(), nullable=True),
        sa.Column("success_rate", sa.Float(), nullable=True),
        sa.Column("avg_reward", sa.Float(), nullable=True),
        sa.Column("avg_turns", sa.Float(), nullable=True),
        sa.Column("successful_tasks", sa.Integer(), nullable=True),
        sa.Column("metrics_json", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.Column(
            "updated_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["training_id"],
            ["training.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
        sa.UniqueConstraint("training_id", "step", name="uq_eval_training_step"),
    )
    op.create_index("ix_eval_status", "eval", ["status"], unique=False)
    op.create_index("ix_eval_training_step", "eval", ["training_id", "step"], unique=False)

    op.create_table(
        "step",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("training_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=True),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=True),
        sa.Column("progress_percent", sa.Float(), server_default=sa.text("0.0"), nullable=True),
        sa.Column("current_phase", sa.Text(), nullable=True),
        sa.Column("rollout_progress", sa.Text(), nullable=True),
        sa.Column("training_progress", sa.Text(), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("start_time", sa.DateTime(), nullable=True),
        sa.Column("end_time", sa.DateTime(), nullable=True),
        sa.Column("rollout_start_time", sa.DateTime(), nullable=True),
        sa.Column("rollout_end_time", sa.DateTime(), nullable=True),
        sa.Column("training_start_time", sa.DateTime(), nullable=True),
        sa.Column("training_end_time", sa.DateTime(), nullable=True),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("model_path", sa.Text(), nullable=True),
        sa.Column("checkpoint_path", sa.Text(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("kl_divergence", sa.Float(), nullable=True),
        sa.Column("policy_gradient_norm", sa.Float(), nullable=True),
        sa.Column("reward_mean", sa.Float(), nullable=True),
        sa.Column("reward_std", sa.Float(), nullable=True),
        sa.Column("num_trajectories", sa.Integer(), nullable=True),
        sa.Column("num_tokens", sa.Integer(), nullable=True),
        sa.Column("metrics_json", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.Column(
            "updated_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["training_id"],
            ["training.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
        sa.UniqueConstraint("training_id", "step", name="uq_step_training_step"),
    )
    op.create_index("ix_step_status", "step", ["status"], unique=False)
    op.create_index("ix_step_training_step", "step", ["training_id", "step"], unique=False)

    op.create_table(
        "validator",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("validator_type", sa.Text(), nullable=False),
        sa.Column("validation_query", sa.Text(), nullable=True),
        sa.Column("validation_method", sa.Text(), nullable=True),
        sa.Column("config_json", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["task.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
    )
    op.create_index("ix_validator_task_id", "validator", ["task_id"], unique=False)

    op.create_table(
        "rollout",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("source_type", sa.Text(), nullable=False),
        sa.Column("step_id", sa.Integer(), nullable=True),
        sa.Column("eval_id", sa.Integer(), nullable=True),
        sa.Column("baseline_id", sa.Integer(), nullable=True),
        sa.Column("rollout_id", sa.Text(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=True),
        sa.Column("group", sa.Integer(), nullable=True),
        sa.Column("group_id", sa.Text(), nullable=True),
        sa.Column("env_index", sa.Integer(), nullable=True),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("model_path", sa.Text(), nullable=False),
        sa.Column("is_eval", sa.Integer(), server_default=sa.text("0"), nullable=True),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=True),
        sa.Column("progress_percent", sa.Float(), server_default=sa.text("0.0"), nullable=True),
        sa.Column("current_phase", sa.Text(), nullable=True),
        sa.Column("current_turn", sa.Integer(), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("start_time", sa.DateTime(), nullable=True),
        sa.Column("end_time", sa.DateTime(), nullable=True),
        sa.Column("env_creation_time", sa.DateTime(), nullable=True),
        sa.Column("agent_init_time", sa.DateTime(), nullable=True),
        sa.Column("task_start_time", sa.DateTime(), nullable=True),
        sa.Column("task_end_time", sa.DateTime(), nullable=True),
        sa.Column("validation_time", sa.DateTime(), nullable=True),
        sa.Column("rollout_time", sa.Float(), nullable=True),
        sa.Column("task_completed", sa.Integer(), nullable=True),
        sa.Column("task_success", sa.Integer(), nullable=True),
        sa.Column("agent_reported_success", sa.Integer(), nullable=True),
        sa.Column("validation_passed", sa.Integer(), nullable=True),
        sa.Column("num_turns", sa.Integer(), nullable=True),
        sa.Column("max_turns", sa.Integer(), nullable=True),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("num_total_actions", sa.Integer(), nullable=True),
        sa.Column("consecutive_repeated_actions", sa.Integer(), nullable=True),
        sa.Column("parse_errors", sa.Integer(), nullable=True),
        sa.Column("tool_name_errors", sa.Integer(), nullable=True),
        sa.Column("tool_arg_errors", sa.Integer(), nullable=True),
        sa.Column("runtime_errors", sa.Integer(), nullable=True),
        sa.Column("ran_out_of_turns", sa.Integer(), nullable=True),
        sa.Column("attempted_completion", sa.Integer(), nullable=True),
        sa.Column("turn_first_success", sa.Integer(), nullable=True),
        sa.Column("turn_task_completed", sa.Integer(), nullable=True),
        sa.Column("errors", sa.Text(), nullable=True),
        sa.Column("summary_json", sa.Text(), nullable=True),
        sa.Column("trajectory_path", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.Column(
            "updated_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.CheckConstraint(
            "(source_type = 'step' AND step_id IS NOT NULL AND eval_id IS NULL AND baseline_id IS NULL) OR (source_type = 'eval' AND eval_id IS NOT NULL AND step_id IS NULL AND baseline_id IS NULL) OR (source_type = 'baseline' AND baseline_id IS NOT NULL AND step_id IS NULL AND eval_id IS NULL)",
            name="ck_rollout_source",
        ),
        sa.ForeignKeyConstraint(
            ["baseline_id"],
            ["baseline.id"],
        ),
        sa.ForeignKeyConstraint(
            ["eval_id"],
            ["eval.id"],
        ),
        sa.ForeignKeyConstraint(
            ["step_id"],
            ["step.id"],
        ),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["task.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
        sa.UniqueConstraint("rollout_id"),
    )
    op.create_index("ix_rollout_rollout_id", "rollout", ["rollout_id"], unique=False)
    op.create_index(
        "ix_rollout_source_baseline", "rollout", ["source_type", "baseline_id"], unique=False
    )
    op.create_index("ix_rollout_source_eval", "rollout", ["source_type", "eval_id"], unique=False)
    op.create_index("ix_rollout_source_step", "rollout", ["source_type", "step_id"], unique=False)
    op.create_index("ix_rollout_status", "rollout", ["status"], unique=False)
    op.create_index("ix_rollout_task_id", "rollout", ["task_id"], unique=False)

    op.create_table(
        "environment",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("env_type", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=True),
        sa.Column("gbox_id", sa.Text(), nullable=True),
        sa.Column("box_type", sa.Text(), nullable=True),
        sa.Column("creation_time", sa.DateTime(), nullable=True),
        sa.Column("termination_time", sa.DateTime(), nullable=True),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("config_json", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.Column(
            "updated_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollout.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
    )
    op.create_index("ix_environment_rollout_id", "environment", ["rollout_id"], unique=False)
    op.create_index("ix_environment_status", "environment", ["status"], unique=False)

    op.create_table(
        "turn",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column(
            "start_time", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=False
        ),
        sa.Column("end_time", sa.DateTime(), nullable=True),
        sa.Column("turn_time", sa.Float(), nullable=True),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("episode_done", sa.Integer(), nullable=True),
        sa.Column("metrics_json", sa.Text(), nullable=True),
        sa.Column("model_response", sa.Text(), nullable=True),
        sa.Column("thinking", sa.Text(), nullable=True),
        sa.Column("parse_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollout.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
        sa.UniqueConstraint("rollout_id", "turn", name="uq_turn_rollout_turn"),
    )
    op.create_index("ix_turn_rollout_turn", "turn", ["rollout_id", "turn"], unique=False)

    op.create_table(
        "validation",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("validator_id", sa.Integer(), nullable=True),
        sa.Column(
            "validation_time",
            sa.DateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("validation_query", sa.Text(), nullable=True),
        sa.Column("expected_result", sa.Text(), nullable=True),
        sa.Column("actual_result", sa.Text(), nullable=True),
        sa.Column("success", sa.Integer(), nullable=False),
        sa.Column("execution_time", sa.Float(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("details_json", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollout.id"],
        ),
        sa.ForeignKeyConstraint(
            ["validator_id"],
            ["validator.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
    )
    op.create_index("ix_validation_rollout_id", "validation", ["rollout_id"], unique=False)

    op.create_table(
        "action",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("turn_id", sa.Integer(), nullable=False),
        sa.Column("action_type", sa.Text(), nullable=True),
        sa.Column("tool_name", sa.Text(), nullable=True),
        sa.Column("tool_args", sa.Text(), nullable=True),
        sa.Column("tokens", sa.Text(), nullable=True),
        sa.Column("logprobs", sa.Text(), nullable=True),
        sa.Column("num_tokens", sa.Integer(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"],
            ["turn.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
    )
    op.create_index("ix_action_turn_id", "action", ["turn_id"], unique=False)

    op.create_table(
        "obs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("client_id", sa.String(length=255), nullable=True),
        sa.Column("turn_id", sa.Integer(), nullable=False),
        sa.Column("obs_type", sa.Text(), nullable=True),
        sa.Column("screenshot_uri", sa.Text(), nullable=True),
        sa.Column("text_content", sa.Text(), nullable=True),
        sa.Column("model_input_json", sa.Text(), nullable=True),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["turn_id"],
            ["turn.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("client_id"),
    )
    op.create_index("ix_obs_turn_id", "obs", ["turn_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_obs_turn_id", table_name="obs")

    op.drop_table("obs")
    op.drop_index("ix_action_turn_id", table_name="action")

    op.drop_table("action")
    op.drop_index("ix_validation_rollout_id", table_name="validation")

    op.drop_table("validation")
    op.drop_index("ix_turn_rollout_turn", table_name="turn")

    op.drop_table("turn")
    op.drop_index("ix_environment_status", table_name="environment")
    op.drop_index("ix_environment_rollout_id", table_name="environment")

    op.drop_table("environment")
    op.drop_index("ix_rollout_task_id", table_name="rollout")
    op.drop_index("ix_rollout_status", table_name="rollout")
    op.drop_index("ix_rollout_source_step", table_name="rollout")
    op.drop_index("ix_rollout_source_eval", table_name="rollout")
    op.drop_index("ix_rollout_source_baseline", table_name="rollout")
    op.drop_index("ix_rollout_rollout_id", table_name="rollout")

    op.drop_table("rollout")
    op.drop_index("ix_validator_task_id", table_name="validator")

    op.drop_table("validator")
    op.drop_index("ix_step_training_step", table_name="step")
    op.drop_index("ix_step_status", table_name="step")

    op.drop_table("step")
    op.drop_index("ix_eval_training_step", table_name="eval")
    op.drop_index("ix_eval_status", table_name="eval")

    op.drop_table("eval")
    op.drop_index("ix_baseline_training_id", table_name="baseline")
    op.drop_index("ix_baseline_status", table_name="baseline")

    op.drop_table("baseline")
    op.drop_index("ix_training_status_heartbeat", table_name="training")
    op.drop_index("ix_training_status", table_name="training")
    op.drop_index("ix_training_run_name", table_name="training")

    op.drop_table("training")
    op.drop_index("ix_task_task_id", table_name="task")

    op.drop_table("task")
    op.drop_index("ix_status_history_entity_time", table_name="status_history")
    op.drop_index("ix_status_history_entity", table_name="status_history")

    op.drop_table("status_history")
