from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from recorder_kit import (
    TOKEN,
    count,
    free_port,
    ingest_server,
    make_task,
    record_episode,
    wait_for,
)
from sqlalchemy import select

from cua_native.monitor.client.lifecycle import TrainingMonitor
from cua_native.monitor.client.recorder import Recorder
from cua_native.monitor.client.sinks import HttpSink, SqlSink, id_pairs
from cua_native.monitor.db import schema
from cua_native.monitor.db.store import MonitorStore

FAST = {"flush_interval": 0.02, "backoff": (0.05, 0.2), "send_timeout": 120.0}


async def test_full_episode_arrives_with_relations(store: MonitorStore, tmp_path: Path) -> None:
    recorder = Recorder([SqlSink(store, owns_store=False)], run_dir=tmp_path / "run", **FAST)
    async with recorder:
        with TrainingMonitor(recorder, model_name="mai-ui-2b", total_steps=3):
            recorder.tasks_registered([make_task("t1")])
            recorder.step_started(0)
            episode = record_episode(recorder, "t1", 3)
            recorder.step_finished(0, loss=0.5, kl=0.01, reward_mean=1.0, num_tokens=9)
    stats = recorder.stats()
    assert stats["monitor/dropped"] == 0 and stats["monitor/sql/rejected"] == 0
    with store.session() as session:
        training = session.scalars(select(schema.Training)).one()
        assert training.status == "completed" and training.model_name == "mai-ui-2b"
        step = session.scalars(select(schema.Step)).one()
        assert (step.training_id, step.status, step.loss) == (training.id, "completed", 0.5)
        rollout = session.scalars(select(schema.Rollout)).one()
        assert rollout.rollout_id == episode and rollout.step_id == step.id
        assert (rollout.status, rollout.num_turns, rollout.reward) == ("completed", 3, 1.0)
        turns = session.scalars(select(schema.Turn).order_by(schema.Turn.turn)).all()
        assert [t.turn for t in turns] == [1, 2, 3]
        assert {t.rollout_id for t in turns} == {rollout.id}
        assert turns[-1].episode_done == 1
        actions = session.scalars(select(schema.Action)).all()
        assert sorted(a.turn_id for a in actions) == sorted(t.id for t in turns)
        assert {a.logprobs for a in actions} == {"[-0.1, -0.2, -0.3]"}
        observations = session.scalars(select(schema.Obs)).all()
        assert len(observations) == 6
        uris = {o.screenshot_uri for o in observations}
        assert len(uris) == 4  # after(n) == before(n+1): each image stored once
        assert all((store.run_dir / uri).is_file() for uri in uris)
        validation = session.scalars(select(schema.Validation)).one()
        assert validation.rollout_id == rollout.id and validation.success == 1
        environment = session.scalars(select(schema.Environment)).one()
        assert (environment.rollout_id, environment.status) == (rollout.id, "terminated")


async def test_calls_return_while_the_sink_hangs(store: MonitorStore, tmp_path: Path) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()
    real = SqlSink(store, owns_store=False)

    class HangingSink:
        name = "hanging"
        destination = "hanging"
        address = "hanging"
        accepts_client_refs = True
        contract_only = False

        async def send(self, batch: dict[str, Any]) -> dict[str, Any]:
            entered.set()
            await release.wait()
            return await real.send(batch)

        async def aclose(self) -> None:
            return None

    recorder = Recorder([HangingSink()], run_dir=tmp_path / "run", **FAST)
    async with recorder:
        recorder.training_started(model_name="m")
        for i in range(20):
            record_episode(recorder, f"t{i}", 3)
        await asyncio.wait_for(entered.wait(), 60)  # the writer ran; the sink is stuck in send
        assert count(store, schema.Rollout) == 0
        stats = recorder.stats()
        assert stats["monitor/queued"] > 20 * 10 and stats["monitor/dropped"] == 0
        release.set()
        await wait_for(lambda: count(store, schema.Turn) == 60)
    assert count(store, schema.Rollout) == 20


async def test_outage_mid_run_delivers_everything_once(store: MonitorStore, tmp_path: Path) -> None:
    port = free_port()
    run_dir = tmp_path / "run"
    async with ingest_server(store, port) as url:
        recorder = Recorder([HttpSink(url, TOKEN, timeout=60.0)], run_dir=run_dir, **FAST)
        await recorder.start()
        recorder.training_started(model_name="m")
        recorder.step_started(0)
        record_episode(recorder, "before", 2)
        await wait_for(lambda: count(store, schema.Rollout) == 1)
    # the server is down: keep recording
    episodes = [record_episode(recorder, f"down{i}", 3) for i in range(4)]
    recorder.step_started(1)
    episodes.append(record_episode(recorder, "down-step1", 2, step=1))
    await wait_for(lambda: recorder.stats()["monitor/http/delayed"] > 0)
    assert count(store, schema.Rollout) == 1
    async with ingest_server(store, port):
        await wait_for(
            lambda: count(store, schema.Rollout) == 6 and count(store, schema.Turn) == 16
        )
        await wait_for(lambda: recorder.stats()["monitor/http/spilled"] == 0)
        await recorder.aclose()
    stats = recorder.stats()
    assert stats["monitor/dropped"] == 0 and stats["monitor/http/rejected"] == 0
    assert count(store, schema.Action) == 16 and count(store, schema.Validation) == 6
    with store.session() as session:
        rollouts = session.scalars(select(schema.Rollout)).all()
        assert {r.status for r in rollouts} == {"completed"}
        assert {r.rollout_id for r in rollouts} >= set(episodes)
        steps = {s.step: s.id for s in session.scalars(select(schema.Step))}
        late = next(r for r in rollouts if r.rollout_id == episodes[-1])
        assert late.step_id == steps[1]
    assert not [p for p in (run_dir / "monitor_spill").glob("http-*.jsonl") if ".ids" not in p.name]


async def test_dead_monitor_at_start_never_fails_training(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    recorder = Recorder([HttpSink(url, TOKEN, timeout=1.0)], run_dir=tmp_path / "run", **FAST)
    async with recorder:
        with TrainingMonitor(recorder, model_name="m"):
            recorder.step_started(0)
            record_episode(recorder, "t", 2)
        await wait_for(lambda: recorder.stats()["monitor/http/failures"] > 0)
    stats = recorder.stats()
    assert stats["monitor/errors"] == 0 and stats["monitor/dropped"] == 0
    assert stats["monitor/http/spilled"] > 0
    (spill,) = [
        p for p in (tmp_path / "run" / "monitor_spill").glob("http-*.jsonl") if ".ids" not in p.name
    ]
    assert spill.stat().st_size > 0


async def test_next_recorder_redelivers_the_spill(store: MonitorStore, tmp_path: Path) -> None:
    port = free_port()
    run_dir = tmp_path / "run"
    async with ingest_server(store, port) as url:
        first = Recorder([HttpSink(url, TOKEN, timeout=60.0)], run_dir=run_dir, **FAST)
        await first.start()
        first.training_started(model_name="m")
        first.step_started(0)
        await wait_for(lambda: count(store, schema.Step) == 1)
    # parents were delivered; the episode is spilled because the server died
    episode = record_episode(first, "t", 3)
    await first.aclose()
    assert first.stats()["monitor/http/spilled"] > 0
    async with ingest_server(store, port) as url:
        second = Recorder([HttpSink(url, TOKEN, timeout=60.0)], run_dir=run_dir, **FAST)
        async with second:
            await wait_for(lambda: count(store, schema.Turn) == 3)
            await wait_for(lambda: second.stats()["monitor/http/spilled"] == 0)
    with store.session() as session:
        rollout = session.scalars(select(schema.Rollout)).one()
        assert rollout.rollout_id == episode and rollout.status == "completed"
        assert rollout.step_id == session.scalars(select(schema.Step.id)).one()


async def test_training_failure_is_recorded_and_reraised(
    store: MonitorStore, tmp_path: Path
) -> None:
    recorder = Recorder([SqlSink(store, owns_store=False)], run_dir=tmp_path / "run", **FAST)
    async with recorder:
        with pytest.raises(RuntimeError, match="boom"):
            with TrainingMonitor(recorder, model_name="m"):
                raise RuntimeError("boom")
    with store.session() as session:
        training = session.scalars(select(schema.Training)).one()
        assert training.status == "failed" and "boom" in (training.error_message or "")


async def test_rejected_rows_do_not_block_the_rest(store: MonitorStore, tmp_path: Path) -> None:
    recorder = Recorder([SqlSink(store, owns_store=False)], run_dir=tmp_path / "run", **FAST)
    async with recorder:
        recorder.training_started(model_name="m")
        recorder.step_finished(0, status="bogus-but-accepted")
        recorder.eval_started(1, model_path="")  # fine
        recorder.baseline_finished(avg_turns="not a number")  # refused by validation
        record_episode(recorder, "t", 1)
    stats = recorder.stats()
    assert stats["monitor/sql/rejected"] == 1
    assert count(store, schema.Turn) == 1
    (rejected_file,) = (tmp_path / "run" / "monitor_spill").glob("sql-*.rejected.jsonl")
    rejected = rejected_file.read_text()
    assert "avg_turns" in rejected


def test_ids_without_client_id_are_taken_in_order() -> None:
    answer = {"actions": [{"id": 7}, {"id": 8}], "turns": [{"client_id": "w", "id": 3}]}
    assert id_pairs("actions", ["x", "y"], answer) == [("x", 7), ("y", 8)]
    assert id_pairs("turns", ["a"], answer, ["w"]) == [("a", 3)]  # the wire id maps back
    assert id_pairs("turns", ["a"], answer) == []  # an id we never sent is not ours


async def test_recorder_in_its_own_thread(store: MonitorStore, tmp_path: Path) -> None:
    recorder = Recorder([SqlSink(store, owns_store=False)], run_dir=tmp_path / "run", **FAST)
    await asyncio.to_thread(recorder.start_in_thread)
    recorder.training_started(model_name="m")
    record_episode(recorder, "t", 2)
    await asyncio.to_thread(recorder.close_in_thread)
    assert count(store, schema.Turn) == 2
