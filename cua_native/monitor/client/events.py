"""Rows: the unit the recorder queues, batches, spills and delivers.

A row is one upsert of one ingest record (``cua_native.monitor.ingest``): its kind (a batch key),
its ``client_id``, the JSON-ready fields it sets, and the parents it refers to by client id. How a
parent reference is written (``<ref>_id`` remote id or ``<ref>_client_id``) is decided per sink
when the row is sent, because each sink has its own ids.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cua_native.gym.protocol import Observation, Screenshot, Task
from cua_native.rollout.records import EpisodeContext, EpisodeRecord, TurnRecord

TRAINING = "training"
"""The one object kind of a batch (the others are arrays, ``ingest.ARRAY_KINDS``)."""


def utc_now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(slots=True)
class Row:
    kind: str
    client_id: str
    fields: dict[str, Any]
    parents: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Reference name (``rollout``) → (parent kind, parent client id)."""
    screenshot: Screenshot | None = None
    """An image still to be turned into ``screenshot_uri`` by the background writer."""
    seq: int = 0
    """When it was recorded (``next_seq``): later upserts of a record win, wherever they sit."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.client_id)

    def to_json(self) -> dict[str, Any]:
        if self.screenshot is not None:
            raise ValueError("a row with an unresolved screenshot cannot be serialized")
        return {
            "kind": self.kind,
            "client_id": self.client_id,
            "fields": self.fields,
            "parents": {name: list(ref) for name, ref in self.parents.items()},
            "seq": self.seq,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        parents = {name: (str(ref[0]), str(ref[1])) for name, ref in data["parents"].items()}
        seq = data.get("seq", 0)
        return cls(
            str(data["kind"]),
            str(data["client_id"]),
            dict(data["fields"]),
            parents,
            seq=seq if isinstance(seq, int) else 0,
        )


class SeqClock:
    """Increasing sequence numbers from the wall clock (so a later process's rows sort after an
    earlier one's), never repeating within a process."""

    def __init__(self) -> None:
        self._last = 0

    def __call__(self) -> int:
        self._last = max(self._last + 1, time.time_ns())
        return self._last


def coalesce(rows: Iterable[Row]) -> list[Row]:
    """Merge upserts of the same record, the later (by ``seq``) fields winning, in first-seen
    order."""
    merged: dict[tuple[str, str], Row] = {}
    for row in sorted(rows, key=lambda r: r.seq):
        seen = merged.get(row.key)
        if seen is None:
            merged[row.key] = Row(
                row.kind,
                row.client_id,
                dict(row.fields),
                dict(row.parents),
                row.screenshot,
                row.seq,
            )
        else:
            seen.fields.update(row.fields)
            seen.parents.update(row.parents)
            seen.seq = row.seq
            if row.screenshot is not None:
                seen.screenshot = row.screenshot
    return list(merged.values())


# --- client ids (the existing Training Monitor's conventions) --------------------------------


def step_client_id(training: str, step: int) -> str:
    return f"step-{training}-{step}-0"


def eval_client_id(training: str, step: int) -> str:
    return f"eval-{training}-{step}"


def baseline_client_id(training: str, index: int) -> str:
    return f"baseline-{training}-{index}"


def turn_client_id(episode_id: str, number: int) -> str:
    return f"{episode_id}:turn:{number}"


# --- episode records → rows -------------------------------------------------------------------


def task_row(task: Task) -> Row:
    return Row(
        "tasks",
        task.task_id,
        {
            "task_id": task.task_id,
            "name": task.name or task.task_id,
            "description": task.description or task.instruction or task.name or task.task_id,
            "difficulty": task.difficulty,
            "category": task.category,
            "max_steps": task.max_steps,
            "tags": list(task.tags),
            "app_name": task.app,
            "source_type": "gym",
        },
    )


def rollout_start_rows(
    context: EpisodeContext, source: tuple[str, tuple[str, str]], model_path: str
) -> list[Row]:
    """The environment (running) and the rollout that links to it (the existing client's link
    direction), at episode start."""
    now = utc_now()
    episode = context.episode_id
    ref, parent = source
    environment = Row(
        "environments",
        f"{episode}:env",
        {
            "env_type": str(context.meta.get("env_type", "gym")),
            "status": "running",
            "gbox_id": context.execution_id,
            "creation_time": now,
        },
    )
    rollout = Row(
        "rollouts",
        episode,
        {
            "rollout_id": episode,
            "source_type": context.source,
            "group_num": group_number(context.group_id),
            "env_index": context.meta.get("env_index", context.meta.get("index_in_group")),
            "model_path": model_path,
            "is_eval": context.source != "step",
            "status": "running",
            "current_phase": "task_execution",
            "current_turn": 0,
            "start_time": now,
            "task_start_time": now,
            "max_turns": context.task.max_steps,
            "summary_json": {"group_id": context.group_id or None},
        },
        {
            "task": ("tasks", context.task.task_id),
            ref: parent,
            "env": ("environments", f"{episode}:env"),
        },
    )
    return [environment, rollout]


def group_number(group_id: str) -> int | None:
    """The contract's integer ``group_num`` for a group's uuid: its first 28 bits (the uuid
    itself goes to ``summary_json.group_id``)."""
    try:
        return int(group_id[:7], 16) if group_id else None
    except ValueError:
        return None


def turn_rows(context: EpisodeContext, turn: TurnRecord) -> list[Row]:
    """The turn, its action (with token ids and logprobs), its screenshots, rollout progress."""
    episode = context.episode_id
    number = turn.index + 1
    turn_id = turn_client_id(episode, number)
    parent = {"turn": ("turns", turn_id)}
    parsed = turn.parsed
    elapsed = float(sum(turn.timings.values()))
    end = datetime.now(UTC)
    step = turn.step
    metrics: dict[str, Any] = {
        "stage_timings": dict(turn.timings),
        "stop_reason": turn.stop_reason,
        "prompt_tokens": len(turn.prompt_ids),
        "output_tokens": len(turn.output_ids),
        "images_in_prompt": turn.images_in_prompt,
        "dropped": dict(turn.dropped),
        "token_mismatch": turn.token_mismatch,
        "summary": parsed.summary,
        "warnings": list(parsed.warnings),
        "extra_calls": parsed.extra_calls,
        "action_ok": None if step is None else step.ok,
        "action_error": None if step is None else step.error,
        "parse_error": (
            None if parsed.error is None else f"{parsed.error.kind}: {parsed.error.message}"
        ),
    }
    rows = [
        Row(
            "turns",
            turn_id,
            {
                "turn": number,
                "start_time": (end - timedelta(seconds=elapsed)).isoformat(),
                "end_time": end.isoformat(),
                "turn_time": elapsed,
                "reward": turn.reward,
                "episode_done": False,
                "model_response": turn.text,
                "thinking": parsed.thought,
                "action_json": None
                if parsed.action is None
                else parsed.action.model_dump(mode="json"),
                "metrics_json": metrics,
            },
            {"rollout": ("rollouts", episode)},
        )
    ]
    action = parsed.action
    rows.append(
        Row(
            "actions",
            f"{turn_id}:action",
            {
                "action_type": None if action is None else action.type,
                "tool_name": None if action is None else getattr(action, "name", action.type),
                "tool_args": None if action is None else action.model_dump(mode="json"),
                "tokens": [
                    {"id": token, "text": text}
                    for token, text in zip(
                        turn.output_ids,
                        turn.output_token_texts or [str(t) for t in turn.output_ids],
                        strict=False,
                    )
                ],
                "logprobs": list(turn.output_logprobs),
                "num_tokens": len(turn.output_ids),
            },
            parent,
        )
    )
    rows.append(_observation_row(f"{turn_id}:screenshot_before", turn.observation, parent))
    if step is not None and step.observation is not None:
        after = _observation_row(f"{turn_id}:screenshot_after", step.observation, parent)
        after.fields["obs_type"] = "screenshot_after"
        after.fields["text_content"] = step.feedback
        rows.append(after)
    progress: dict[str, Any] = {"current_turn": number}
    if context.task.max_steps:
        progress["progress_percent"] = min(100.0, 100.0 * number / context.task.max_steps)
    rows.append(Row("rollouts", episode, progress))
    return rows


def _observation_row(client_id: str, observation: Observation, parent: dict[str, Any]) -> Row:
    return Row(
        "observations",
        client_id,
        {
            "obs_type": "screenshot_before",
            "model_input_json": {"width": observation.width, "height": observation.height},
        },
        dict(parent),
        screenshot=observation.screenshot,
    )


def episode_end_rows(record: EpisodeRecord) -> list[Row]:
    """Final rollout status and counts, environment terminated, last turn done, validation."""
    context = record.context
    episode = context.episode_id
    now = utc_now()
    figures = record.figures()
    errors = figures.parse_errors
    turns = record.turns
    actions = [t.parsed.action for t in turns if t.parsed.action is not None]
    failed_steps = [t.step for t in turns if t.step is not None and not t.step.ok]
    last = actions[-1] if actions else None
    finished = record.end_reason in ("terminate", "answer")
    rejected = record.outcome == "rejected"
    rows = [
        Row(
            "rollouts",
            episode,
            {
                "status": "failed" if rejected else "completed",
                "current_phase": "cleanup",
                "status_message": record.end_reason or None,
                "error_message": record.reject_reason,
                "end_time": now,
                "task_end_time": now,
                "rollout_time": float(sum(record.timings.values())),
                "reward": figures.reward,
                "task_success": figures.success,
                "task_completed": finished,
                "agent_reported_success": (
                    getattr(last, "status", None) == "success" if last is not None else None
                ),
                "validation_passed": (
                    None if record.evaluation is None else record.evaluation.success
                ),
                "num_turns": figures.turns,
                "num_total_actions": len(actions),
                "consecutive_repeated_actions": _longest_repeat(actions),
                "parse_errors": errors["format"],
                "tool_name_errors": errors["tool_name"],
                "tool_arg_errors": errors["tool_arg"],
                "runtime_errors": len(failed_steps),
                "ran_out_of_turns": record.end_reason == "max_turns",
                "attempted_completion": finished,
                "turn_task_completed": figures.turns if finished else None,
                "turn_first_success": figures.turns if figures.success else None,
                "errors": [s.error for s in failed_steps if s.error]
                + [
                    f"{t.parsed.error.kind}: {t.parsed.error.message}"
                    for t in turns
                    if t.parsed.error is not None
                ],
                "summary_json": {
                    "group_id": context.group_id or None,
                    "outcome": record.outcome,
                    "end_reason": record.end_reason,
                    "reward": figures.reward,
                    "success": figures.success,
                    "answer": record.answer,
                    "num_turns": figures.turns,
                    "timings": dict(record.timings),
                    "execution_id": context.execution_id,
                    "task_id": context.task.task_id,
                    "model_version": context.model_version,
                    "recovered_calls": record.recovered_calls,
                    "lost_executions": list(record.lost_executions),
                    "replayed_actions": record.replayed_actions,
                    "engine_retries": record.engine_retries,
                    "recovery_s": round(record.recovery_s + record.engine_wait_s, 3),
                },
            },
        ),
        Row(
            "environments",
            f"{episode}:env",
            {
                "status": "error" if rejected else "terminated",
                "termination_time": now,
                "status_message": record.end_reason or None,
                "error_message": record.reject_reason,
            },
        ),
    ]
    if turns:
        last_turn = turn_client_id(episode, turns[-1].index + 1)
        rows.append(
            Row("turns", last_turn, {"episode_done": True}, {"rollout": ("rollouts", episode)})
        )
    evaluation = record.evaluation
    if evaluation is not None:
        rows.append(
            Row(
                "validations",
                f"{episode}:validation",
                {
                    "validation_time": now,
                    "success": evaluation.success,
                    "actual_result": (
                        f"reward={evaluation.reward}, validators={len(evaluation.validators)}"
                    ),
                    "details_json": {
                        "genv_evaluation": evaluation.raw,
                        "evaluation_output": evaluation.raw,
                        "reward": evaluation.reward,
                        "validators": [asdict(v) for v in evaluation.validators],
                        "answer": record.answer,
                        "task_id": context.task.task_id,
                        "execution_id": context.execution_id,
                    },
                },
                {"rollout": ("rollouts", episode)},
            )
        )
    return rows


def _longest_repeat(actions: list[Any]) -> int:
    longest = run = 0
    previous = None
    for action in actions:
        run = run + 1 if action == previous else 1
        longest = max(longest, run)
        previous = action
    return longest
