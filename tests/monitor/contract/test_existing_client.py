"""The existing Training Monitor's client (babelcloud/AReaL ``examples/cua_agent/cua_rl/database``,
vendored unchanged) against ``cua_native.monitor``'s server: every call it makes, with the
payloads its call sites build, is accepted and everything it sends is kept; and our HTTP sink
sends only what that client sends."""

from __future__ import annotations

import copy
import json
import logging
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from contract_kit import TOKEN, client_keys, recorded_client, run_record_helpers, run_training

from cua_native.monitor.db import schema
from cua_native.monitor.db.progress import closing
from cua_native.monitor.db.store import MonitorStore

MODELS: dict[str, Any] = {
    "training": schema.Training,
    "tasks": schema.Task,
    "validators": schema.Validator,
    "environments": schema.Environment,
    "steps": schema.Step,
    "baselines": schema.Baseline,
    "evals": schema.Eval,
    "rollouts": schema.Rollout,
    "turns": schema.Turn,
    "actions": schema.Action,
    "observations": schema.Obs,
    "validations": schema.Validation,
}
RENAMED = {("rollouts", "group_num"): "group"}
"""Contract keys stored under the seed schema's name for the same thing."""
PROGRESS = {
    ("training", "current_step"),
    ("training", "progress_percent"),
    *{("steps", f) for f in ("rollout_progress", "progress_percent", "reward_mean", "reward_std")},
    ("steps", "num_trajectories"),
    *{
        (kind, f)
        for kind in ("evals", "baselines")
        for f in (
            "completed_tasks",
            "total_tasks",
            "successful_tasks",
            "success_rate",
            "avg_reward",
            "avg_turns",
            "progress_percent",
        )
    },
    ("rollouts", "current_turn"),
    ("rollouts", "progress_percent"),
    ("rollouts", "num_turns"),
}
"""Progress fields the store maintains from child rows (seed "进展跟踪说明"): an explicit null
from the sender does not erase them."""


def _same(stored: Any, sent: Any) -> bool:
    if sent is None or stored is None:
        return stored is sent
    if isinstance(sent, bool):
        return stored == int(sent)
    if isinstance(sent, dict | list):
        return json.loads(stored) == sent
    if isinstance(stored, datetime) and isinstance(sent, str):
        return datetime.fromisoformat(sent).replace(tzinfo=None) == stored
    return bool(stored == sent)


def _final_state(calls: list[Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """What each row must hold: the last value the client sent for each of its keys."""
    final: dict[tuple[str, int], dict[str, Any]] = {}
    for payload, answer in calls:
        for kind, value in payload.items():
            if kind == "training":
                final.setdefault((kind, answer["training_id"]), {}).update(value)
                continue
            assert len(answer[kind]) == len(value), (kind, answer)
            for record, mapping in zip(value, answer[kind], strict=True):
                final.setdefault((kind, mapping["id"]), {}).update(record)
    return final


def _closed_at_end(kind: str, row: Any) -> bool:
    """The store closed this row when its training completed (``progress.closing``): the
    client left it open (its flow never finishes the baseline, the eval or the step)."""
    how = closing("completed")
    if kind == "steps":
        return (row.status, row.error_message) == (how.step_status, how.step_message)
    return kind in ("evals", "baselines", "rollouts") and (row.status, row.error_message) == (
        how.status,
        how.message,
    )


def _assert_kept(store: MonitorStore, calls: list[Any]) -> int:
    checked = 0
    with store.session() as session:
        for (kind, row_id), sent in _final_state(calls).items():
            row = session.get(MODELS[kind], row_id)
            assert row is not None, (kind, row_id)
            for key, value in sent.items():
                if (kind, key) == ("training", "training_id"):
                    continue
                if value is None and (kind, key) in PROGRESS:
                    continue
                column = RENAMED.get((kind, key), key)
                stored = getattr(row, column)
                if value is None and MODELS[kind].__table__.c[column].server_default is not None:
                    continue  # an explicit null on a column with a seed default: the default
                if key in ("status", "error_message", "end_time") and _closed_at_end(kind, row):
                    continue  # left open when the training completed: closed, saying why
                assert _same(stored, value), (
                    f"{kind}[{row_id}].{key}: sent {value!r}, kept {stored!r}"
                )
                checked += 1
    return checked


def test_every_call_of_the_existing_client_is_accepted_and_kept(
    server: str,
    store: MonitorStore,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="cua_rl")
    with recorded_client(monkeypatch, tmp_path) as calls:
        ids = run_training(server, TOKEN)
    complaints = [r.getMessage() for r in caplog.records if r.name.startswith("cua_rl")]
    assert complaints == []  # the client logs every refused call and every missing id
    assert len(calls) >= 57
    assert _assert_kept(store, calls) > 300
    with store.session() as session:
        training = session.get(schema.Training, ids["training_id"])
        assert training is not None and training.status == "completed"
        assert (training.experiment_name, training.trial_name) == ("cua_agent", "run")
        rollout = session.get(schema.Rollout, ids["rollouts"]["step"])
        assert rollout is not None and rollout.step_id == ids["step_id"]
        environment = session.get(schema.Environment, rollout.env_id)
        assert environment is not None and environment.rollout_id == rollout.id
        assert len(session.query(schema.Action).filter_by(turn_id=None).all()) == 0
        assert session.query(schema.Validation).count() == 3
    # the dashboard link the client logs: {base}/{training_id}?project_id=…
    link = f"{server}/{ids['training_id']}?project_id=p1"
    answer = httpx.get(link, headers={"Authorization": f"Bearer {TOKEN}"}, follow_redirects=True)
    assert answer.status_code == 200 and "cua_agent_run" in answer.text


def test_the_clients_record_helpers_are_accepted_and_kept(
    server: str, store: MonitorStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with recorded_client(monkeypatch, tmp_path) as calls:
        run_record_helpers(server, TOKEN)
    assert [next(iter(payload)) for payload, _ in calls] == [
        "training", "tasks", "validators", "environments", "steps", "baselines", "evals",
        "rollouts", "turns", "actions", "observations", "validations",
    ]  # fmt: skip
    assert _assert_kept(store, calls) > 150


async def test_our_http_sink_sends_only_what_the_client_sends(
    server: str, store: MonitorStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import asyncio

    from recorder_kit import finish, make_context, make_task, run_episode_turns

    from cua_native.monitor.client.lifecycle import TrainingMonitor
    from cua_native.monitor.client.recorder import Recorder
    from cua_native.monitor.client.sinks import HttpSink

    with recorded_client(monkeypatch, tmp_path) as calls:
        await asyncio.to_thread(run_training, server, TOKEN)
        await asyncio.to_thread(run_record_helpers, server, TOKEN)
    allowed = client_keys(calls)

    ours: list[dict[str, Any]] = []
    send = HttpSink.send

    async def recording(self: HttpSink, batch: dict[str, Any]) -> dict[str, Any]:
        ours.append(copy.deepcopy(batch))
        return await send(self, batch)

    monkeypatch.setattr(HttpSink, "send", recording)
    recorder = Recorder(
        [HttpSink(server, TOKEN)], run_dir=tmp_path / "ours", run_name="ours", flush_interval=0.02
    )
    async with TrainingMonitor(recorder, model_name="m", config={"a": 1}, total_steps=1) as monitor:
        monitor.tasks([make_task("t1")])
        monitor.baseline_started("m", total_tasks=1)
        for source, step in (("baseline", 0), ("step", 0), ("eval", 0)):
            if source == "step":
                monitor.step_started(0)
            if source == "eval":
                monitor.eval_started(0, "m", total_tasks=1)
            context = make_context(make_task("t1"), step=step, source=source)
            recorder.episode_started(context)
            turns = run_episode_turns(context, 2)
            for turn in turns:
                recorder.turn_finished(context, turn)
            recorder.episode_finished(finish(context, turns))
        monitor.step_training(0)
        monitor.step_finished(0, {"ppo_actor/update/actor_loss/avg": 0.5})
        monitor.eval_finished(0, success_rate=1.0)
        monitor.baseline_finished(success_rate=1.0)
    assert recorder.undelivered() == []
    sent: dict[str, list[dict[str, Any]]] = {}
    for batch in ours:
        for kind, value in batch.items():
            sent.setdefault(kind, []).extend(value if isinstance(value, list) else [value])
    assert set(sent) == set(allowed) - {"validators"}
    for kind, records in sent.items():
        for record in records:
            extra = set(record) - allowed[kind]
            assert not extra, f"{kind}: keys the existing client never sends: {extra}"
    for kind in ("training", "actions", "observations", "validations"):
        assert all("client_id" not in r for r in sent[kind]), kind
    assert all("rollout_id" not in r for r in sent["environments"])
    assert all("env_id" in r for r in sent["rollouts"])
    with store.session() as session:
        training_id = session.query(schema.Training).filter_by(run_name="ours").one().id
    assert all(re.fullmatch(rf"step-{training_id}-\d+-0", r["client_id"]) for r in sent["steps"])
    assert all(isinstance(r.get("group_num", 0), int | None) for r in sent["rollouts"])
    # and what it sent landed: the dashboard's extras came through the contract's JSON fields
    with store.session() as session:
        rollouts = session.query(schema.Rollout).filter(schema.Rollout.rollout_id.like("%")).all()
        ours_rows = [r for r in rollouts if not r.rollout_id.startswith(("rollout-", "recorded"))]
        assert len(ours_rows) == 3 and all(r.status == "completed" for r in ours_rows)
        shots = session.query(schema.Obs).filter(schema.Obs.width.isnot(None)).count()
        assert shots == 3 * 2 * 2
