"""SQLAlchemy 2 models of the monitor schema (``docs/monitor.md``).

The 13 seed tables with their columns, defaults, uniques and indexes, plus (additively):
a ``client_id`` on every ingestable table (the upsert key of the ingest contract),
``rollout.group_id``, ``turn.model_response``/``thinking``/``parse_error`` and
``obs.width``/``height``, and (migration 0002) the columns the existing Training Monitor's
client sends that the seed lacks: ``training.experiment_name``/``trial_name``, the
``avg_turn_time``/``estimated_*`` timings, ``task.instruction``, ``rollout.env_id`` (the client
links rollout → environment; ``environment.rollout_id`` became nullable and is back-filled),
``rollout.gbox_run_id``/``gbox_base_url``/``trajectory_data_json``,
``turn.text``/``screen_before``/``screen_after``/``action_json``/``model_specific_input_json``,
``action.action_name``/``action_args``/``action_call_id``/``action_json`` and
``validation.screenshot_uri``. No ``group`` table: a rollout's ``group`` number and ``group_id`` are
enough to group it on the dashboard. Migration 0003 adds what the store maintains itself, never a
sender: a step's running tallies of its rollouts (``step.tally_*``) and per-group counters
(``step_group``), so a batch updates a step's figures in time independent of the step's size
(``tally.py``).

Timestamps are naive UTC. JSON columns are TEXT as in the seed (portable to both backends).
The schema is created and evolved only by the Alembic migrations in ``migrations/``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NOW = text("CURRENT_TIMESTAMP")

ROLLOUT_SOURCE_RULE = (
    "(source_type = 'step' AND step_id IS NOT NULL AND eval_id IS NULL AND baseline_id IS NULL)"
    " OR (source_type = 'eval' AND eval_id IS NOT NULL AND step_id IS NULL"
    " AND baseline_id IS NULL)"
    " OR (source_type = 'baseline' AND baseline_id IS NOT NULL AND step_id IS NULL"
    " AND eval_id IS NULL)"
)

STATUS_ENTITIES: tuple[str, ...] = (
    "training",
    "baseline",
    "eval",
    "step",
    "rollout",
    "environment",
)


class Base(DeclarativeBase):
    pass


def _client_id() -> Mapped[str | None]:
    return mapped_column(String(255), unique=True)


def _tally(kind: type[Integer] | type[Float[float]]) -> Mapped[Any]:
    return mapped_column(kind, nullable=False, server_default=text("0"))


def _created() -> Mapped[datetime | None]:
    return mapped_column(DateTime, server_default=NOW)


class Training(Base):
    __tablename__ = "training"
    __table_args__ = (
        Index("ix_training_run_name", "run_name"),
        Index("ix_training_status", "status"),
        Index("ix_training_status_heartbeat", "status", "last_heartbeat"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    run_name: Mapped[str] = mapped_column(Text, unique=True)
    log_path: Mapped[str] = mapped_column(Text)
    model_name: Mapped[str] = mapped_column(Text)
    lora_rank: Mapped[int | None] = mapped_column(Integer)
    learning_rate: Mapped[float | None] = mapped_column(Float)
    batch_size: Mapped[int | None] = mapped_column(Integer)
    group_size: Mapped[int | None] = mapped_column(Integer)
    groups_per_batch: Mapped[int | None] = mapped_column(Integer)
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    temperature: Mapped[float | None] = mapped_column(Float)
    kl_penalty_coef: Mapped[float | None] = mapped_column(Float)
    num_substeps: Mapped[int | None] = mapped_column(Integer)
    max_turns: Mapped[int | None] = mapped_column(Integer)
    seed: Mapped[int | None] = mapped_column(Integer)
    box_type: Mapped[str | None] = mapped_column(Text)
    renderer_name: Mapped[str | None] = mapped_column(Text)
    wandb_project: Mapped[str | None] = mapped_column(Text)
    wandb_name: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str | None] = mapped_column(Text, server_default=text("'pending'"))
    progress_percent: Mapped[float | None] = mapped_column(Float, server_default=text("0.0"))
    current_step: Mapped[int | None] = mapped_column(Integer)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    current_phase: Mapped[str | None] = mapped_column(Text)
    status_message: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    start_time: Mapped[datetime | None] = mapped_column(DateTime)
    end_time: Mapped[datetime | None] = mapped_column(DateTime)
    last_heartbeat: Mapped[datetime | None] = mapped_column(DateTime, server_default=NOW)
    config_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()
    experiment_name: Mapped[str | None] = mapped_column(Text)
    trial_name: Mapped[str | None] = mapped_column(Text)
    avg_turn_time: Mapped[float | None] = mapped_column(Float)
    estimated_total_time: Mapped[float | None] = mapped_column(Float)
    estimated_remaining_time: Mapped[float | None] = mapped_column(Float)


class _EvalColumns:
    """Columns shared by ``baseline`` and ``eval``."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    training_id: Mapped[int] = mapped_column(ForeignKey("training.id"))
    model_path: Mapped[str] = mapped_column(Text)
    status: Mapped[str | None] = mapped_column(Text, server_default=text("'pending'"))
    progress_percent: Mapped[float | None] = mapped_column(Float, server_default=text("0.0"))
    current_task_index: Mapped[int | None] = mapped_column(Integer)
    total_tasks: Mapped[int | None] = mapped_column(Integer)
    completed_tasks: Mapped[int | None] = mapped_column(Integer)
    current_phase: Mapped[str | None] = mapped_column(Text)
    status_message: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    start_time: Mapped[datetime | None] = mapped_column(DateTime)
    end_time: Mapped[datetime | None] = mapped_column(DateTime)
    eval_time: Mapped[datetime | None] = mapped_column(DateTime)
    success_rate: Mapped[float | None] = mapped_column(Float)
    avg_reward: Mapped[float | None] = mapped_column(Float)
    avg_turns: Mapped[float | None] = mapped_column(Float)
    successful_tasks: Mapped[int | None] = mapped_column(Integer)
    metrics_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()
    avg_turn_time: Mapped[float | None] = mapped_column(Float)
    estimated_total_time: Mapped[float | None] = mapped_column(Float)
    estimated_remaining_time: Mapped[float | None] = mapped_column(Float)


class Baseline(_EvalColumns, Base):
    __tablename__ = "baseline"
    __table_args__ = (
        Index("ix_baseline_training_id", "training_id"),
        Index("ix_baseline_status", "status"),
    )


class Eval(_EvalColumns, Base):
    __tablename__ = "eval"
    __table_args__ = (
        UniqueConstraint("training_id", "step", name="uq_eval_training_step"),
        Index("ix_eval_training_step", "training_id", "step"),
        Index("ix_eval_status", "status"),
    )

    step: Mapped[int] = mapped_column(Integer)


class Task(Base):
    __tablename__ = "task"
    __table_args__ = (Index("ix_task_task_id", "task_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    task_id: Mapped[str] = mapped_column(Text, unique=True)
    name: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text)
    difficulty: Mapped[str | None] = mapped_column(Text)
    category: Mapped[str | None] = mapped_column(Text)
    max_steps: Mapped[int | None] = mapped_column(Integer)
    validation_type: Mapped[str | None] = mapped_column(Text)
    validation_query: Mapped[str | None] = mapped_column(Text)
    expected_result: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[str | None] = mapped_column(Text)
    prerequisites: Mapped[str | None] = mapped_column(Text)
    app_name: Mapped[str | None] = mapped_column(Text)
    source_type: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()
    instruction: Mapped[str | None] = mapped_column(Text)


class Validator(Base):
    __tablename__ = "validator"
    __table_args__ = (Index("ix_validator_task_id", "task_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    task_id: Mapped[int] = mapped_column(ForeignKey("task.id"))
    validator_type: Mapped[str] = mapped_column(Text)
    validation_query: Mapped[str | None] = mapped_column(Text)
    validation_method: Mapped[str | None] = mapped_column(Text)
    config_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()


class Step(Base):
    __tablename__ = "step"
    __table_args__ = (
        UniqueConstraint("training_id", "step", name="uq_step_training_step"),
        Index("ix_step_training_step", "training_id", "step"),
        Index("ix_step_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    training_id: Mapped[int] = mapped_column(ForeignKey("training.id"))
    step: Mapped[int] = mapped_column(Integer)
    batch: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str | None] = mapped_column(Text, server_default=text("'pending'"))
    progress_percent: Mapped[float | None] = mapped_column(Float, server_default=text("0.0"))
    current_phase: Mapped[str | None] = mapped_column(Text)
    rollout_progress: Mapped[str | None] = mapped_column(Text)
    training_progress: Mapped[str | None] = mapped_column(Text)
    status_message: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    start_time: Mapped[datetime | None] = mapped_column(DateTime)
    end_time: Mapped[datetime | None] = mapped_column(DateTime)
    rollout_start_time: Mapped[datetime | None] = mapped_column(DateTime)
    rollout_end_time: Mapped[datetime | None] = mapped_column(DateTime)
    training_start_time: Mapped[datetime | None] = mapped_column(DateTime)
    training_end_time: Mapped[datetime | None] = mapped_column(DateTime)
    learning_rate: Mapped[float | None] = mapped_column(Float)
    model_path: Mapped[str | None] = mapped_column(Text)
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    loss: Mapped[float | None] = mapped_column(Float)
    kl_divergence: Mapped[float | None] = mapped_column(Float)
    policy_gradient_norm: Mapped[float | None] = mapped_column(Float)
    reward_mean: Mapped[float | None] = mapped_column(Float)
    reward_std: Mapped[float | None] = mapped_column(Float)
    num_trajectories: Mapped[int | None] = mapped_column(Integer)
    num_tokens: Mapped[int | None] = mapped_column(Integer)
    metrics_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()
    avg_turn_time: Mapped[float | None] = mapped_column(Float)
    estimated_total_time: Mapped[float | None] = mapped_column(Float)
    estimated_remaining_time: Mapped[float | None] = mapped_column(Float)
    # running tallies of the step's rollouts, kept by the store (``tally.py``; migration 0003)
    tally_rollouts: Mapped[int] = _tally(Integer)
    tally_finished: Mapped[int] = _tally(Integer)
    tally_rewarded: Mapped[int] = _tally(Integer)
    """Finished rollouts with a reward."""
    tally_reward_sum: Mapped[float] = _tally(Float)
    tally_reward_squares: Mapped[float] = _tally(Float)
    tally_groups: Mapped[int] = _tally(Integer)
    tally_complete_groups: Mapped[int] = _tally(Integer)


class StepGroup(Base):
    """Rollouts and open (not finished) rollouts of one group of one step, kept by the store
    (``tally.py``; migration 0003). ``group_key`` is ``tally.group_key``: ``g:`` and the
    rollout's ``group_id``, else its ``group`` number; ``-`` for rollouts with neither."""

    __tablename__ = "step_group"

    step_id: Mapped[int] = mapped_column(ForeignKey("step.id"), primary_key=True)
    group_key: Mapped[str] = mapped_column(Text, primary_key=True)
    rollouts: Mapped[int] = _tally(Integer)
    open_rollouts: Mapped[int] = _tally(Integer)


class Rollout(Base):
    __tablename__ = "rollout"
    __table_args__ = (
        CheckConstraint(ROLLOUT_SOURCE_RULE, name="ck_rollout_source"),
        Index("ix_rollout_source_step", "source_type", "step_id"),
        Index("ix_rollout_source_eval", "source_type", "eval_id"),
        Index("ix_rollout_source_baseline", "source_type", "baseline_id"),
        Index("ix_rollout_task_id", "task_id"),
        Index("ix_rollout_rollout_id", "rollout_id"),
        Index("ix_rollout_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    source_type: Mapped[str] = mapped_column(Text)
    step_id: Mapped[int | None] = mapped_column(ForeignKey("step.id"))
    eval_id: Mapped[int | None] = mapped_column(ForeignKey("eval.id"))
    baseline_id: Mapped[int | None] = mapped_column(ForeignKey("baseline.id"))
    rollout_id: Mapped[str] = mapped_column(Text, unique=True)
    batch: Mapped[int | None] = mapped_column(Integer)
    group: Mapped[int | None] = mapped_column(Integer)
    group_id: Mapped[str | None] = mapped_column(Text)
    env_index: Mapped[int | None] = mapped_column(Integer)
    task_id: Mapped[int] = mapped_column(ForeignKey("task.id"))
    model_path: Mapped[str] = mapped_column(Text)
    is_eval: Mapped[int | None] = mapped_column(Integer, server_default=text("0"))
    status: Mapped[str | None] = mapped_column(Text, server_default=text("'pending'"))
    progress_percent: Mapped[float | None] = mapped_column(Float, server_default=text("0.0"))
    current_phase: Mapped[str | None] = mapped_column(Text)
    current_turn: Mapped[int | None] = mapped_column(Integer)
    status_message: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    start_time: Mapped[datetime | None] = mapped_column(DateTime)
    end_time: Mapped[datetime | None] = mapped_column(DateTime)
    env_creation_time: Mapped[datetime | None] = mapped_column(DateTime)
    agent_init_time: Mapped[datetime | None] = mapped_column(DateTime)
    task_start_time: Mapped[datetime | None] = mapped_column(DateTime)
    task_end_time: Mapped[datetime | None] = mapped_column(DateTime)
    validation_time: Mapped[datetime | None] = mapped_column(DateTime)
    rollout_time: Mapped[float | None] = mapped_column(Float)
    task_completed: Mapped[int | None] = mapped_column(Integer)
    task_success: Mapped[int | None] = mapped_column(Integer)
    agent_reported_success: Mapped[int | None] = mapped_column(Integer)
    validation_passed: Mapped[int | None] = mapped_column(Integer)
    num_turns: Mapped[int | None] = mapped_column(Integer)
    max_turns: Mapped[int | None] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)
    temperature: Mapped[float | None] = mapped_column(Float)
    num_total_actions: Mapped[int | None] = mapped_column(Integer)
    consecutive_repeated_actions: Mapped[int | None] = mapped_column(Integer)
    parse_errors: Mapped[int | None] = mapped_column(Integer)
    tool_name_errors: Mapped[int | None] = mapped_column(Integer)
    tool_arg_errors: Mapped[int | None] = mapped_column(Integer)
    runtime_errors: Mapped[int | None] = mapped_column(Integer)
    ran_out_of_turns: Mapped[int | None] = mapped_column(Integer)
    attempted_completion: Mapped[int | None] = mapped_column(Integer)
    turn_first_success: Mapped[int | None] = mapped_column(Integer)
    turn_task_completed: Mapped[int | None] = mapped_column(Integer)
    errors: Mapped[str | None] = mapped_column(Text)
    summary_json: Mapped[str | None] = mapped_column(Text)
    trajectory_path: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()
    env_id: Mapped[int | None] = mapped_column(
        ForeignKey("environment.id", name="fk_rollout_env_id", use_alter=True)
    )
    gbox_run_id: Mapped[str | None] = mapped_column(Text)
    gbox_base_url: Mapped[str | None] = mapped_column(Text)
    trajectory_data_json: Mapped[str | None] = mapped_column(Text)


class Turn(Base):
    __tablename__ = "turn"
    __table_args__ = (
        UniqueConstraint("rollout_id", "turn", name="uq_turn_rollout_turn"),
        Index("ix_turn_rollout_turn", "rollout_id", "turn"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollout.id"))
    turn: Mapped[int] = mapped_column(Integer)
    start_time: Mapped[datetime] = mapped_column(DateTime, server_default=NOW)
    end_time: Mapped[datetime | None] = mapped_column(DateTime)
    turn_time: Mapped[float | None] = mapped_column(Float)
    reward: Mapped[float | None] = mapped_column(Float)
    episode_done: Mapped[int | None] = mapped_column(Integer)
    metrics_json: Mapped[str | None] = mapped_column(Text)
    model_response: Mapped[str | None] = mapped_column(Text)
    thinking: Mapped[str | None] = mapped_column(Text)
    parse_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    text: Mapped[str | None] = mapped_column(Text)
    screen_before: Mapped[str | None] = mapped_column(Text)
    screen_after: Mapped[str | None] = mapped_column(Text)
    action_json: Mapped[str | None] = mapped_column(Text)
    model_specific_input_json: Mapped[str | None] = mapped_column(Text)


class Action(Base):
    __tablename__ = "action"
    __table_args__ = (Index("ix_action_turn_id", "turn_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    turn_id: Mapped[int] = mapped_column(ForeignKey("turn.id"))
    action_type: Mapped[str | None] = mapped_column(Text)
    tool_name: Mapped[str | None] = mapped_column(Text)
    tool_args: Mapped[str | None] = mapped_column(Text)
    tokens: Mapped[str | None] = mapped_column(Text)
    logprobs: Mapped[str | None] = mapped_column(Text)
    num_tokens: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime | None] = _created()
    action_name: Mapped[str | None] = mapped_column(Text)
    action_args: Mapped[str | None] = mapped_column(Text)
    action_call_id: Mapped[str | None] = mapped_column(Text)
    action_json: Mapped[str | None] = mapped_column(Text)


class Obs(Base):
    __tablename__ = "obs"
    __table_args__ = (Index("ix_obs_turn_id", "turn_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    turn_id: Mapped[int] = mapped_column(ForeignKey("turn.id"))
    obs_type: Mapped[str | None] = mapped_column(Text)
    screenshot_uri: Mapped[str | None] = mapped_column(Text)
    text_content: Mapped[str | None] = mapped_column(Text)
    model_input_json: Mapped[str | None] = mapped_column(Text)
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime | None] = _created()


class Validation(Base):
    __tablename__ = "validation"
    __table_args__ = (Index("ix_validation_rollout_id", "rollout_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollout.id"))
    validator_id: Mapped[int | None] = mapped_column(ForeignKey("validator.id"))
    validation_time: Mapped[datetime] = mapped_column(DateTime, server_default=NOW)
    validation_query: Mapped[str | None] = mapped_column(Text)
    expected_result: Mapped[str | None] = mapped_column(Text)
    actual_result: Mapped[str | None] = mapped_column(Text)
    success: Mapped[int] = mapped_column(Integer)
    execution_time: Mapped[float | None] = mapped_column(Float)
    error_message: Mapped[str | None] = mapped_column(Text)
    details_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    screenshot_uri: Mapped[str | None] = mapped_column(Text)


class Environment(Base):
    __tablename__ = "environment"
    __table_args__ = (
        Index("ix_environment_rollout_id", "rollout_id"),
        Index("ix_environment_status", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client_id: Mapped[str | None] = _client_id()
    rollout_id: Mapped[int | None] = mapped_column(ForeignKey("rollout.id"))
    env_type: Mapped[str] = mapped_column(Text)
    status: Mapped[str | None] = mapped_column(Text, server_default=text("'pending'"))
    gbox_id: Mapped[str | None] = mapped_column(Text)
    box_type: Mapped[str | None] = mapped_column(Text)
    creation_time: Mapped[datetime | None] = mapped_column(DateTime)
    termination_time: Mapped[datetime | None] = mapped_column(DateTime)
    status_message: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    config_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime | None] = _created()
    updated_at: Mapped[datetime | None] = _created()


class StatusHistory(Base):
    __tablename__ = "status_history"
    __table_args__ = (
        Index("ix_status_history_entity", "entity_type", "entity_id"),
        Index("ix_status_history_entity_time", "entity_type", "entity_id", "changed_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    entity_type: Mapped[str] = mapped_column(Text)
    entity_id: Mapped[int] = mapped_column(Integer)
    old_status: Mapped[str | None] = mapped_column(Text)
    new_status: Mapped[str] = mapped_column(Text)
    progress_percent: Mapped[float | None] = mapped_column(Float)
    status_message: Mapped[str | None] = mapped_column(Text)
    metadata_json: Mapped[str | None] = mapped_column(Text)
    changed_at: Mapped[datetime] = mapped_column(DateTime, server_default=NOW)
    created_at: Mapped[datetime | None] = _created()
