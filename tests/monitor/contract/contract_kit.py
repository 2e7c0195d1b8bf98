"""Drives the existing Training Monitor client (``vendored/cua_rl/database``, unchanged) the way
its call sites do: ``train.py`` (training start/end, tasks, step hook), ``monitor_training_hooks``
(step, baseline, eval), ``cua_workflow.py`` + ``core/mini_agent_runner.py`` (one rollout per
source with turns, actions, observations, validation), with the payloads those call sites build.
Every ``_post_batch`` is recorded with its answer."""

from __future__ import annotations

import builtins
import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

TOKEN = "project-token"
DEBUG_LOG_PREFIX = "/home/zhenwei/"
"""The vendored recorder appends debug lines to a developer's home; tests send them elsewhere."""


@contextmanager
def recorded_client(monkeypatch: pytest.MonkeyPatch, debug_dir: Path) -> Iterator[list[Any]]:
    from cua_rl.database import http_rollout_recorder
    from cua_rl.database.ingest_client import IngestClient

    calls: list[tuple[dict[str, Any], dict[str, Any]]] = []
    original = IngestClient._post_batch

    def post_batch(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
        answer = original(self, payload)
        calls.append((copy.deepcopy(payload), answer))
        return answer

    def redirected_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(DEBUG_LOG_PREFIX):
            path = debug_dir / Path(str(path)).name
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(IngestClient, "_post_batch", post_batch)
    monkeypatch.setattr(http_rollout_recorder, "open", redirected_open, raising=False)
    yield calls


def run_rollout(
    client: Any, training_id: int, source: str, parent_id: int | None, turns: int = 2
) -> int:
    """One episode as ``cua_workflow.arun_episode`` + ``run_mini_agent_rollout`` record it."""
    from cua_rl.database.http_rollout_recorder import HttpRolloutRecorder

    uuid = f"rollout-{source}-{parent_id}"
    ids = {"step_id": None, "eval_id": None, "baseline_id": None, f"{source}_id": parent_id}
    recorder = HttpRolloutRecorder(
        client, uuid, training_id, source, model_path="Qwen3-VL-8B", **ids
    )
    assert recorder.start_rollout(
        task_id_str="task-1",
        task_description="Open the settings app",
        model_path="Qwen3-VL-8B",
        env_type="genv",
        source_type=source,
        batch=0,
        group_num=3,
        env_index=1,
        max_turns=5,
        **ids,
    )
    run_id = f"run-{uuid}"
    recorder.update_environment(gbox_id=run_id, status="running")
    recorder.update_status(
        status="running",
        current_phase="task_execution",
        status_message=f"gbox-mini-agent run_id={run_id}",
        gbox_run_id=run_id,
        gbox_base_url="http://gbox.local:8080",
    )
    details: dict[str, Any] = {"rollout_id": uuid, "turns": [], "events": []}
    for turn in range(1, turns + 1):
        recorder.start_turn(turn)
        recorder.update_status(status="running", current_phase="task_execution", current_turn=turn)
        action = {"name": "click", "args": {"x": 100 * turn, "y": 200}, "callId": f"call-{turn}"}
        assert recorder.record_action(turn_num=turn, action=action) is not None
        messages = [
            {"role": "user", "content": [{"type": "image_url", "url": f"https://tos/s{turn}.png"}]}
        ]
        assert (
            recorder.record_observation(
                turn_num=turn,
                obs_type="model_input",
                model_input={"messages": messages, "meta": {"turn": turn}},
            )
            is not None
        )
        before, after = f"https://tos/s{turn}.png", f"https://tos/s{turn + 1}.png"
        recorder.record_observation(
            turn_num=turn, obs_type="screenshot_before", screenshot_uri=before
        )
        recorder.record_observation(
            turn_num=turn, obs_type="screenshot_after", screenshot_uri=after
        )
        details["turns"].append({"turn": turn, "action": action})
        recorder.update(
            trajectory_data_json=json.dumps({"training_data": [], "execution_details": details})
        )
        recorder.end_turn(
            turn_num=turn,
            model_response=json.dumps({"thinking": "tap", "text": "", "action": [action]}),
            reward=0.0,
            episode_done=False,
            screen_before=before,
            screen_after=after,
            thinking="tap the icon",
            text="tapping",
            action_json=action,
            model_specific_input={"prompt_tokens": 1200},
            turn_time=1.75,
            metrics={"stage_timings": {"model_inference": 0.5, "action_exec": 0.25}},
        )
    recorder.update_environment(
        status="terminated", termination_time=datetime.utcnow().isoformat(), status_message="done"
    )
    recorder.update_status(status="completed", current_phase="cleanup", status_message="done")
    evaluation = {"success": True, "result": {"score": 1.0, "validators": [{"id": "v1"}]}}
    recorder.record_validation(
        success=True,
        actual_result="reward=1.0, validators=1",
        details_json={
            "genv_evaluation": evaluation,
            "evaluation_output": evaluation,
            "reward": 1.0,
            "task_id": "task-1",
            "execution_id": "exec-1",
        },
    )
    recorder.complete_rollout(
        reward=1.0,
        task_success=True,
        validation_passed=True,
        num_turns=turns,
        summary_json=json.dumps({"evaluate_output": evaluation, "reward": 1.0}),
    )
    assert recorder.remote_rollout_id is not None
    return recorder.remote_rollout_id


def run_training(base_url: str, token: str) -> dict[str, Any]:
    """The whole client side of one training; returns the ids it got."""
    from cua_rl.database import monitor_context, monitor_training_hooks
    from cua_rl.database.ingest_client import IngestClient

    ingest = IngestClient(base_url, token)
    monitor_context.set_ingest_client(ingest)
    training_id = ingest.post_training(
        {
            "run_name": "cua_agent_run_20260101-000000",
            "status": "running",
            "current_phase": "rollout",
            "experiment_name": "cua_agent",
            "trial_name": "run",
        }
    )
    assert training_id is not None
    monitor_context.set_training_id(training_id)
    for task in ("task-1", "task-2"):
        payload = {"task_id": task, "name": f"Task {task}", "description": "", "source_type": "gym"}
        assert ingest.post_task(payload, task) is not None
    step_id = monitor_training_hooks.record_step_before_rollout(step=0, batch=None)
    baseline_id = monitor_training_hooks.create_baseline_via_monitor("Qwen3-VL-8B")
    eval_id = monitor_training_hooks.create_eval_via_monitor(1, "Qwen3-VL-8B")
    assert None not in (step_id, baseline_id, eval_id)
    rollouts = {
        source: run_rollout(IngestClient(base_url, token), training_id, source, parent)
        for source, parent in (("step", step_id), ("eval", eval_id), ("baseline", baseline_id))
    }
    ingest.post_training({"status": "completed", "training_id": training_id})
    monitor_context.clear_monitor_context()
    return {"training_id": training_id, "step_id": step_id, "rollouts": rollouts}


def client_keys(calls: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, set[str]]:
    """Every key the client sent, per batch kind."""
    keys: dict[str, set[str]] = {}
    for payload, _ in calls:
        for kind, value in payload.items():
            records = value if isinstance(value, list) else [value]
            for record in records:
                keys.setdefault(kind, set()).update(record)
    return keys


class Record:
    """An ORM-like object for the client's ``record_*`` helpers: named attributes, ``None`` for
    the rest (ids are strings: the helpers key their id maps by ``str(local_id)``)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        return None


def run_record_helpers(base_url: str, token: str) -> None:
    """Every ``IngestClient.record_*`` helper once, parents before children."""
    from cua_rl.database.ingest_client import IngestClient

    now = datetime(2026, 1, 2, 3, 4, 5)
    client = IngestClient(base_url, token)
    client.record_training(
        Record(
            id="1",
            run_name="recorded_run",
            log_path="/runs/recorded",
            model_name="Qwen3-VL-8B",
            learning_rate=1e-6,
            status="running",
            start_time=now,
            config_json=json.dumps({"lr": 1e-6}),
            avg_turn_time=2.5,
            estimated_total_time=100.0,
            estimated_remaining_time=50.0,
            created_at=now,
            updated_at=now,
        )
    )
    client.record_task(
        Record(id="2", task_id="task-r", name="R", instruction="Do R", description="d", tags=["a"])
    )
    client.record_validator(Record(id="3", task_id="2", validator_type="state", config_json="{}"))
    client.record_environment(Record(id="4", env_type="android", status="running", created_at=now))
    client.record_step(
        Record(id="5", training_id="1", step=0, status="training", avg_turn_time=1.0)
    )
    client.record_baseline(Record(id="6", training_id="1", model_path="m", status="running"))
    client.record_eval(Record(id="7", training_id="1", step=0, model_path="m", avg_turns=3.0))
    client.record_rollout(
        Record(
            id="8",
            env_id="4",
            task_id="2",
            step_id="5",
            source_type="step",
            rollout_id="recorded-rollout",
            group_num=1,
            model_path="m",
            trajectory_data_json="{}",
        )
    )
    client.record_turn(Record(id="9", rollout_id="8", turn=1, screen_before="https://tos/a.png"))
    client.record_action(
        Record(id="10", turn_id="9", action_type="click", action_name="click", tokens=[1, 2])
    )
    client.record_observation(Record(id="11", turn_id="9", obs_type="screenshot_before"))
    client.record_validation(Record(id="12", rollout_id="8", validator_id="3", success=True))
