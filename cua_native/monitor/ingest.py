"""The ingest contract: the batch format shared by the recorder and the store.

It is the existing Training Monitor's ``POST {base}/api/ingest/batch`` body. A batch is a dict with
any of these keys (processed in this order, so a parent sent in the same batch can be referenced):

    training (object), tasks, validators, baselines, evals, steps, rollouts, environments,
    turns, actions, observations, validations (arrays of objects)

Every record carries a ``client_id`` (a string unique within its kind; the ``training`` object may
instead name ``training_id`` or ``run_name``). Sending the same ``client_id`` again is an UPSERT:
only the keys present in the record are written, so an update sends just what changed.

Foreign keys are given either as the client id of a parent already sent (``training_client_id``,
``task_client_id``, ``step_client_id``, ``eval_client_id``, ``baseline_client_id``,
``rollout_client_id``, ``turn_client_id``, ``validator_client_id``) or as the remote integer id
the monitor answered (``training_id``, ``task_id`` (validators/rollouts only), ``step_id``,
``eval_id``, ``baseline_id``, ``rollout_id`` (turns/environments/validations), ``turn_id``,
``validator_id``). Beware the seed schema's homonyms: ``TaskIn.task_id`` and
``RolloutIn.rollout_id`` are the string identifiers of the task/rollout, not foreign keys.

Value conventions:
- timestamps: ``datetime`` or ISO-8601 strings (naive values are taken as UTC);
- 0/1 columns accept ``bool``;
- ``*_json``, ``tags``, ``prerequisites``, ``errors``, ``tool_args``, ``tokens``, ``logprobs``,
  ``rollout_progress``, ``training_progress``: any JSON value (stored as JSON text; a ``str`` is
  stored as is, so pre-encoded JSON is fine);
- ``ObservationIn.screenshot_uri``: an ``http(s)`` URL, a path relative to the run directory, or a
  ``data:image/...;base64,...`` URI, which the store writes once under
  ``<run_dir>/screenshots/<sha[:2]>/<sha>.<ext>`` and replaces by that relative path.
- ``RolloutIn.source_type`` is ``step``/``eval``/``baseline`` with exactly one of the matching
  parent keys (the store infers it from the parent when omitted; the database enforces the rule).
- ``ActionIn``: ``action_type`` is the canonical action ``type`` and ``tool_args`` the canonical
  action as a dict (normalized coordinates), which the dashboard draws on the screenshot.

Answer (:class:`IngestResult`): ``training_id`` for a training post and, for each array sent,
``{kind: [{"client_id": ..., "id": ...}, ...]}`` in the order sent.

Unknown keys are rejected (``extra="forbid"``) so that a typo is an error, not lost data.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SourceType = Literal["step", "eval", "baseline"]
JsonValue = Any
"""Any JSON value; stored as JSON text (a ``str`` is stored unchanged)."""

ClientId = str


INT_LIMIT = 2**63 - 1


Where = str | tuple[Any, Any]
"""Where a value sits, for the error message: a name, or (parent, key) formatted only on error
(the records of a batch have thousands of keys and no errors)."""


MAX_DEPTH = 32
"""How deeply a record may nest, the record itself being the first level (JSON objects and
arrays). What the recorder and the existing client send nests a few levels; a deeper record is
refused (HTTP 422) before anything walks it recursively."""


def clean_value(value: Any, where: Where = "value", depth: int = 0) -> Any:
    """A JSON value made safe for both backends: NUL characters (PostgreSQL text cannot hold
    them) become U+FFFD; NaN/infinite numbers, integers beyond 64 bits and containers nested
    deeper than ``MAX_DEPTH`` raise ``ValueError`` (a deterministic rejection, HTTP 422)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{_path(where)}: {value} is not a finite number")
        return value
    if isinstance(value, int):
        if not -INT_LIMIT - 1 <= value <= INT_LIMIT:
            raise ValueError(f"{_path(where)}: integer {value} does not fit in 64 bits")
        return value
    if isinstance(value, dict | list | tuple) and depth >= MAX_DEPTH:
        raise ValueError(f"{_path(where)}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        return _clean_dict(value, where, depth + 1)
    if isinstance(value, list | tuple):
        return _clean_list(value, where, depth + 1)
    return value


def _clean_dict(value: dict[Any, Any], where: Where, depth: int) -> dict[Any, Any]:
    """``clean_value`` of each key and value; plain scalars are checked inline (a record is
    mostly scalars, and a batch has thousands of records)."""
    out: dict[Any, Any] = {}
    for key, item in value.items():
        if type(key) is str and "\x00" in key:
            key = key.replace("\x00", "\ufffd")
        kind = type(item)
        if item is None or kind is bool:
            out[key] = item
        elif kind is str:
            out[key] = item.replace("\x00", "\ufffd") if "\x00" in item else item
        elif kind is float and math.isfinite(item):
            out[key] = item
        elif kind is int and -INT_LIMIT - 1 <= item <= INT_LIMIT:
            out[key] = item
        else:
            out[key] = clean_value(item, (where, key), depth)
    return out


def _path(where: Where) -> str:
    parts = []
    while not isinstance(where, str):  # a loop: a refused value may nest deeply
        where, key = where
        parts.append(str(key))
    return ".".join([where, *reversed(parts)])


def _clean_list(value: list[Any] | tuple[Any, ...], where: Where, depth: int) -> list[Any]:
    """``clean_value`` of each item, with C-speed checks for the common homogeneous lists
    (token texts, logprobs, ids): a NUL in the joined strings, a non-finite sum (any NaN or
    infinity makes it so), the extreme integers."""
    kinds = set(map(type, value))
    if kinds == {str}:
        if "\x00" not in "".join(value):
            return list(value)
    elif kinds == {float}:
        if math.isfinite(sum(value)):
            return list(value)
    elif kinds == {int} and -INT_LIMIT - 1 <= min(value) and max(value) <= INT_LIMIT:
        return list(value)
    return [clean_value(item, where, depth) for item in value]


class _Clean(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _clean(cls, data: Any) -> Any:
        return clean_value(data, cls.__name__) if isinstance(data, dict) else data


class _Record(_Clean):
    model_config = ConfigDict(extra="forbid")

    client_id: ClientId = Field(min_length=1)
    created_at: datetime | None = None

    def given(self) -> dict[str, Any]:
        """The keys the sender set (an upsert writes only these)."""
        return self.model_dump(exclude_unset=True)


class TrainingIn(_Clean):
    model_config = ConfigDict(extra="forbid")

    client_id: ClientId | None = Field(default=None, min_length=1)
    training_id: int | None = None
    """Remote id of an existing training, to update it."""
    run_name: str | None = None
    log_path: str | None = None
    model_name: str | None = None
    lora_rank: int | None = None
    learning_rate: float | None = None
    batch_size: int | None = None
    group_size: int | None = None
    groups_per_batch: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    kl_penalty_coef: float | None = None
    num_substeps: int | None = None
    max_turns: int | None = None
    seed: int | None = None
    box_type: str | None = None
    renderer_name: str | None = None
    wandb_project: str | None = None
    wandb_name: str | None = None
    status: str | None = None
    progress_percent: float | None = None
    current_step: int | None = None
    total_steps: int | None = None
    current_phase: str | None = None
    status_message: str | None = None
    error_message: str | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    last_heartbeat: datetime | None = None
    config_json: JsonValue = None
    experiment_name: str | None = None
    trial_name: str | None = None
    avg_turn_time: float | None = None
    estimated_total_time: float | None = None
    estimated_remaining_time: float | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @model_validator(mode="after")
    def _identified(self) -> TrainingIn:
        if self.client_id is None and self.training_id is None and self.run_name is None:
            raise ValueError("a training needs client_id, training_id or run_name")
        return self

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class TaskIn(_Record):
    task_id: str | None = None
    """The task's string identifier (unique), not a foreign key."""
    name: str | None = None
    description: str | None = None
    difficulty: str | None = None
    category: str | None = None
    max_steps: int | None = None
    validation_type: str | None = None
    validation_query: str | None = None
    expected_result: str | None = None
    tags: JsonValue = None
    prerequisites: JsonValue = None
    app_name: str | None = None
    source_type: str | None = None
    instruction: str | None = None
    updated_at: datetime | None = None


class ValidatorIn(_Record):
    task_client_id: ClientId | None = None
    task_id: int | None = None
    validator_type: str | None = None
    validation_query: str | None = None
    validation_method: str | None = None
    config_json: JsonValue = None


class _EvalLike(_Record):
    training_client_id: ClientId | None = None
    training_id: int | None = None
    model_path: str | None = None
    status: str | None = None
    progress_percent: float | None = None
    current_task_index: int | None = None
    total_tasks: int | None = None
    completed_tasks: int | None = None
    current_phase: str | None = None
    status_message: str | None = None
    error_message: str | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    eval_time: datetime | None = None
    success_rate: float | None = None
    avg_reward: float | None = None
    avg_turns: float | None = None
    successful_tasks: int | None = None
    metrics_json: JsonValue = None
    avg_turn_time: float | None = None
    estimated_total_time: float | None = None
    estimated_remaining_time: float | None = None
    updated_at: datetime | None = None


class BaselineIn(_EvalLike):
    pass


class EvalIn(_EvalLike):
    step: int | None = None
    """The training step the evaluation was run at."""


class StepIn(_Record):
    training_client_id: ClientId | None = None
    training_id: int | None = None
    step: int | None = None
    batch: int | None = None
    status: str | None = None
    progress_percent: float | None = None
    current_phase: str | None = None
    rollout_progress: JsonValue = None
    """``{completed_groups, total_groups, completed_envs, total_envs}``; totals sent here are kept,
    the completed counts are maintained by the store as rollouts finish."""
    training_progress: JsonValue = None
    """``{completed_substeps, total_substeps}``."""
    status_message: str | None = None
    error_message: str | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    rollout_start_time: datetime | None = None
    rollout_end_time: datetime | None = None
    training_start_time: datetime | None = None
    training_end_time: datetime | None = None
    learning_rate: float | None = None
    model_path: str | None = None
    checkpoint_path: str | None = None
    loss: float | None = None
    kl_divergence: float | None = None
    policy_gradient_norm: float | None = None
    reward_mean: float | None = None
    reward_std: float | None = None
    num_trajectories: int | None = None
    num_tokens: int | None = None
    metrics_json: JsonValue = None
    avg_turn_time: float | None = None
    estimated_total_time: float | None = None
    estimated_remaining_time: float | None = None
    updated_at: datetime | None = None


class RolloutIn(_Record):
    source_type: SourceType | None = None
    step_client_id: ClientId | None = None
    step_id: int | None = None
    eval_client_id: ClientId | None = None
    eval_id: int | None = None
    baseline_client_id: ClientId | None = None
    baseline_id: int | None = None
    task_client_id: ClientId | None = None
    task_id: int | None = None
    rollout_id: str | None = None
    """The rollout's string identifier (unique, e.g. the episode uuid), not a foreign key."""
    env_client_id: ClientId | None = None
    env_id: int | None = None
    """The rollout's environment: the existing client posts the environment first and links
    the rollout to it (the store also fills ``environment.rollout_id``)."""
    batch: int | None = None
    group: int | None = None
    group_num: int | None = None
    """The group number within the step (the existing client's key; stored in ``group``)."""
    group_id: str | int | None = None
    env_index: int | None = None
    model_path: str | None = None
    is_eval: bool | None = None
    status: str | None = None
    progress_percent: float | None = None
    current_phase: str | None = None
    current_turn: int | None = None
    status_message: str | None = None
    error_message: str | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    env_creation_time: datetime | None = None
    agent_init_time: datetime | None = None
    task_start_time: datetime | None = None
    task_end_time: datetime | None = None
    validation_time: datetime | None = None
    rollout_time: float | None = None
    task_completed: bool | None = None
    task_success: bool | None = None
    agent_reported_success: bool | None = None
    validation_passed: bool | None = None
    num_turns: int | None = None
    max_turns: int | None = None
    reward: float | None = None
    temperature: float | None = None
    num_total_actions: int | None = None
    consecutive_repeated_actions: int | None = None
    parse_errors: int | None = None
    tool_name_errors: int | None = None
    tool_arg_errors: int | None = None
    runtime_errors: int | None = None
    ran_out_of_turns: bool | None = None
    attempted_completion: bool | None = None
    turn_first_success: int | None = None
    turn_task_completed: int | None = None
    errors: JsonValue = None
    summary_json: JsonValue = None
    trajectory_path: str | None = None
    trajectory_data_json: JsonValue = None
    gbox_run_id: str | None = None
    gbox_base_url: str | None = None
    updated_at: datetime | None = None


class EnvironmentIn(_Record):
    rollout_client_id: ClientId | None = None
    rollout_id: int | None = None
    env_type: str | None = None
    status: str | None = None
    gbox_id: str | None = None
    box_type: str | None = None
    creation_time: datetime | None = None
    termination_time: datetime | None = None
    status_message: str | None = None
    error_message: str | None = None
    config_json: JsonValue = None
    updated_at: datetime | None = None


class TurnIn(_Record):
    rollout_client_id: ClientId | None = None
    rollout_id: int | None = None
    turn: int | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    turn_time: float | None = None
    reward: float | None = None
    episode_done: bool | None = None
    metrics_json: JsonValue = None
    model_response: str | None = None
    """The model's raw output text."""
    thinking: str | None = None
    """The thought the dialect parsed out of the output."""
    parse_error: str | None = None
    """``"<kind>: <message>"`` when the output could not be parsed (senders that speak only the
    existing monitor's keys put it in ``metrics_json.parse_error``; the store copies it here)."""
    text: str | None = None
    screen_before: str | None = None
    screen_after: str | None = None
    action_json: JsonValue = None
    model_specific_input_json: JsonValue = None


class ActionIn(_Record):
    turn_client_id: ClientId | None = None
    turn_id: int | None = None
    action_type: str | None = None
    tool_name: str | None = None
    tool_args: JsonValue = None
    tokens: JsonValue = None
    """Output token texts (JSON array of strings), aligned with ``logprobs``."""
    logprobs: JsonValue = None
    num_tokens: int | None = None
    action_name: str | None = None
    action_args: JsonValue = None
    action_call_id: str | None = None
    action_json: JsonValue = None


class ObservationIn(_Record):
    turn_client_id: ClientId | None = None
    turn_id: int | None = None
    obs_type: str | None = None
    screenshot_uri: str | None = None
    text_content: str | None = None
    model_input_json: JsonValue = None
    width: int | None = None
    height: int | None = None
    """Pixel size of the screenshot, when known (the dashboard sizes the overlay with it;
    senders that speak only the existing monitor's keys put them in ``model_input_json``)."""


class ValidationIn(_Record):
    rollout_client_id: ClientId | None = None
    rollout_id: int | None = None
    validator_client_id: ClientId | None = None
    validator_id: int | None = None
    validation_time: datetime | None = None
    validation_query: str | None = None
    expected_result: str | None = None
    actual_result: str | None = None
    success: bool | None = None
    execution_time: float | None = None
    error_message: str | None = None
    details_json: JsonValue = None
    screenshot_uri: str | None = None


class _Anonymous(BaseModel):
    """Kinds the existing client posts without ``client_id`` (it reads ``response[kind][0].id``):
    without one, each record is a new row."""

    client_id: ClientId | None = Field(default=None, min_length=1)


class ActionRecord(_Anonymous, ActionIn):
    pass


class ObservationRecord(_Anonymous, ObservationIn):
    pass


class ValidationRecord(_Anonymous, ValidationIn):
    pass


class IngestBatch(BaseModel):
    """One ``POST /api/ingest/batch`` body."""

    model_config = ConfigDict(extra="forbid")

    training: TrainingIn | None = None
    tasks: list[TaskIn] = Field(default_factory=list)
    validators: list[ValidatorIn] = Field(default_factory=list)
    baselines: list[BaselineIn] = Field(default_factory=list)
    evals: list[EvalIn] = Field(default_factory=list)
    steps: list[StepIn] = Field(default_factory=list)
    rollouts: list[RolloutIn] = Field(default_factory=list)
    environments: list[EnvironmentIn] = Field(default_factory=list)
    turns: list[TurnIn] = Field(default_factory=list)
    actions: list[ActionRecord] = Field(default_factory=list)
    observations: list[ObservationRecord] = Field(default_factory=list)
    validations: list[ValidationRecord] = Field(default_factory=list)


ARRAY_KINDS: tuple[str, ...] = (
    "tasks",
    "validators",
    "baselines",
    "evals",
    "steps",
    "environments",
    "rollouts",
    "turns",
    "actions",
    "observations",
    "validations",
)
"""The array keys of a batch, in the order the store applies them (parents first)."""


class IdMapping(BaseModel):
    client_id: ClientId | None = None
    id: int


class IngestResult(BaseModel):
    """The answer to a batch: ``training_id`` and, per array kind sent, ``[{client_id, id}]``."""

    model_config = ConfigDict(extra="forbid")

    training_id: int | None = None
    tasks: list[IdMapping] | None = None
    validators: list[IdMapping] | None = None
    baselines: list[IdMapping] | None = None
    evals: list[IdMapping] | None = None
    steps: list[IdMapping] | None = None
    rollouts: list[IdMapping] | None = None
    environments: list[IdMapping] | None = None
    turns: list[IdMapping] | None = None
    actions: list[IdMapping] | None = None
    observations: list[IdMapping] | None = None
    validations: list[IdMapping] | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class IngestError(ValueError):
    """A batch the store cannot apply (unknown parent, missing required field, rule broken).

    Nothing of the batch was written."""


def describe(error: ValidationError, most: int = 5) -> str:
    """A batch's validation problems on one line: ``where: what; ...`` (the first ``most``)."""
    problems = []
    for item in error.errors()[:most]:
        where = ".".join(str(part) for part in item["loc"]) or "batch"
        problems.append(f"{where}: {' '.join(str(item['msg']).split())}")
    more = error.error_count() - most
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


def parse_batch(batch: dict[str, Any]) -> IngestBatch:
    """Validate a raw batch (raises ``pydantic.ValidationError`` with every problem)."""
    return IngestBatch.model_validate(batch)
