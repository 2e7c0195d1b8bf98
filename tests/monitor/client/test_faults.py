"""Nothing lost, nothing corrupted: each fault of the monitor path, reproduced. No sleeps: sinks
go down and up by flag, waits are bounded polls of the recorder's own counters."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from recorder_kit import (
    TOKEN,
    count,
    finish,
    free_port,
    ingest_server,
    make_context,
    make_task,
    record_episode,
    run_episode_turns,
    wait_for,
)
from sqlalchemy import select

from cua_native.gym.protocol import Screenshot
from cua_native.monitor.client.drain import drain
from cua_native.monitor.client.events import Row
from cua_native.monitor.client.lifecycle import LEDGER, RunLedger, TrainingMonitor, new_run_name
from cua_native.monitor.client.recorder import Recorder
from cua_native.monitor.client.sinks import HttpSink, SinkUnavailable, SqlSink
from cua_native.monitor.client.spill import SinkChannel, SpillLog
from cua_native.monitor.db import schema
from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.service.dashboard.app import create_app

FAST = {"flush_interval": 0.02, "backoff": (0.01, 0.05), "send_timeout": 120.0}


class SwitchSink(SqlSink):
    """A real store behind a switch: ``down`` makes every send fail as a dead network would."""

    def __init__(self, store: MonitorStore) -> None:
        super().__init__(store, owns_store=False)
        self.down = False
        self.attempts = 0

    async def send(self, batch: dict[str, Any]) -> dict[str, Any]:
        self.attempts += 1
        if self.down:
            raise SinkUnavailable("switched off")
        return await super().send(batch)


def noise(seed: int) -> Screenshot:
    """A screenshot PNG cannot shrink (~150 KB): batches of them need splitting."""
    pixels = random.Random(seed).randbytes(160 * 320 * 3)
    return Screenshot(image=Image.frombytes("RGB", (160, 320), pixels))


def spill_lines(run_dir: Path) -> int:
    return sum(
        len(p.read_text().splitlines())
        for p in (run_dir / "monitor_spill").glob("*.jsonl")
        if not p.name.endswith((".ids.jsonl", ".rejected.jsonl"))
    )


async def test_retries_never_re_append_the_spill_and_the_last_update_wins(
    store: MonitorStore, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    sink = SwitchSink(store)
    recorder = Recorder([sink], run_dir=run_dir, **FAST)
    async with TrainingMonitor(recorder, model_name="m"):
        sink.down = True
        recorder.step_started(0)
        for i in range(5):
            record_episode(recorder, f"t{i}")
        recorder.step_finished(0)
        await wait_for(lambda: recorder.stats()["monitor/sql/failures"] >= 6)
        recorded = recorder.stats()["monitor/queued"]
        assert spill_lines(run_dir) <= recorded  # 6 failed retries, each row spilled once
        sink.down = False
        await wait_for(lambda: recorder.stats()["monitor/sql/spilled"] == 0)
    (training,) = _all(store, schema.Training)
    assert training.status == "completed" and training.end_time is not None
    assert count(store, schema.Rollout) == 5 and count(store, schema.Turn) == 10
    assert count(store, schema.Action) == 10  # each exactly once
    assert {s.status for s in _all(store, schema.Step)} == {"completed"}


def _all(store: MonitorStore, model: Any) -> list[Any]:
    with store.session() as session:
        return list(session.scalars(select(model)))


async def test_ids_are_kept_per_destination(tmp_path: Path) -> None:
    """One run dir used with two monitors: the second never gets the first one's ids."""
    first = MonitorStore.open(None, run_dir=tmp_path / "a")
    second = MonitorStore.open(None, run_dir=tmp_path / "b")
    second.ingest(  # another user's tasks already there: ids differ between the two
        {
            "tasks": [
                {"client_id": f"x{i}", "task_id": f"x{i}", "name": "x", "description": "x"}
                for i in range(3)
            ]
        }
    )
    run_dir = tmp_path / "run"
    try:
        for store in (first, second):
            port = free_port()
            async with ingest_server(store, port) as url:
                recorder = Recorder([HttpSink(url, TOKEN)], run_dir=run_dir, **FAST)
                async with TrainingMonitor(recorder, model_name="m"):
                    recorder.step_started(0)
                    record_episode(recorder, "t1")
                assert recorder.undelivered() == []
        for store in (first, second):
            with store.session() as session:
                rollout = session.scalars(select(schema.Rollout)).one()
                task = session.get(schema.Task, rollout.task_id)
                step = session.get(schema.Step, rollout.step_id)
                training = session.scalars(select(schema.Training)).one()
            assert task is not None and task.task_id == "t1"
            assert step is not None and step.training_id == training.id
        assert len(list((run_dir / "monitor_spill").glob("http-*.ids.jsonl"))) == 2
    finally:
        first.close()
        second.close()


async def test_poison_rows_are_isolated_and_the_rest_delivered(
    store: MonitorStore, tmp_path: Path
) -> None:
    channel = SinkChannel(SqlSink(store, owns_store=False), tmp_path / "spill", batch_rows=64)
    await channel.start()
    rows = [Row("tasks", f"t{i}", {"task_id": f"t{i}", "name": "n", "description": "d"})
            for i in range(40)]  # fmt: skip
    rows[7].fields["max_steps"] = 2**70
    rows[23].fields["tags"] = {"score": float("nan")}
    rows[31].fields["name"] = "nul\x00byte"  # sanitised, stored
    channel.submit(rows)
    await wait_for(lambda: channel.stats()["delivered"] == 38)
    await channel.aclose()
    assert channel.counts["rejected"] == 2 and count(store, schema.Task) == 38
    with store.session() as session:
        assert session.scalars(select(schema.Task.name).where(schema.Task.task_id == "t31")).one()
    (rejected,) = (tmp_path / "spill").glob("*.rejected.jsonl")
    reasons = [json.loads(line)["reason"] for line in rejected.read_text().splitlines()]
    assert any("64 bits" in r for r in reasons) and any("finite" in r for r in reasons)


async def test_poison_over_http_is_422_not_500(store: MonitorStore) -> None:
    app = create_app(store, token=TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://m") as c:
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        for body in (
            b'{"tasks": [{"client_id": "a", "task_id": "a", "name": "n", "description": "d",'
            b' "max_steps": 99999999999999999999999}]}',
            b'{"rollouts": [{"client_id": "r", "reward": NaN}]}',
            b'{"steps": [{"client_id": "s", "progress_percent": "much"}]}',
            b"[1, 2]",
        ):
            answer = await c.post("/api/ingest/batch", content=body, headers=auth)
            assert answer.status_code == 422, (body, answer.text)
        steps = {
            "training": {"run_name": "r"},
            "steps": [{"client_id": "s", "training_client_id": None, "training_id": 1,
                       "step": 0, "rollout_progress": {"total_envs": "x"}}],
        }  # fmt: skip
        assert (await c.post("/api/ingest/batch", json=steps, headers=auth)).status_code == 200
        for path in ("/screenshots/a%00b.png", "/rollouts/99999999999999999999999"):
            assert (await c.get(path, headers=auth)).status_code == 404, path


def test_a_torn_last_spill_line_is_cut_and_kept_aside(tmp_path: Path) -> None:
    log = SpillLog(tmp_path, "d")
    log.append([Row("tasks", "a", {"task_id": "a"}), Row("tasks", "b", {"task_id": "b"})])
    with log.path.open("ab") as handle:
        handle.write(b'{"kind": "tasks", "client_id": "c", "fie')  # the crash
    reopened = SpillLog(tmp_path, "d")
    reopened.append([Row("tasks", "d", {"task_id": "d"})])
    rows, _, consumed, bad = reopened.read(10)
    assert [r.client_id for r in rows] == ["a", "b", "d"] and consumed == 3 and bad == []
    assert b'"client_id": "c"' in (tmp_path / "d.torn").read_bytes()


async def test_disk_full_keeps_rows_in_memory_and_never_raises(
    store: MonitorStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="cua_native.monitor")
    sink = SwitchSink(store)
    recorder = Recorder([sink], run_dir=tmp_path / "run", **FAST)

    def full(self: SpillLog, rows: list[Row]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SpillLog, "append", full)
    async with TrainingMonitor(recorder, model_name="m"):
        sink.down = True
        record_episode(recorder, "t")
        await wait_for(lambda: recorder.stats()["monitor/sql/unspilled"] > 0)
        # the warning says where the rows are: in memory, not "spilled" by a write that failed
        warnings = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
        assert warnings and all("kept in memory" in w for w in warnings), warnings
        assert not any("spilled" in w for w in warnings), warnings
        sink.down = False  # the sink comes back before the end: nothing is lost
        await wait_for(lambda: count(store, schema.Turn) == 2)
    assert recorder.undelivered() == []
    sink.down = True
    second = Recorder([sink], run_dir=tmp_path / "run2", **FAST)
    async with second:
        record_episode(second, "u")
    (line,) = second.undelivered()  # the end reports what the full disk cost
    assert "could not be written to disk" in line


async def test_monitor_down_says_so_and_drain_delivers_once(
    store: MonitorStore, tmp_path: Path
) -> None:
    port = free_port()
    run_dir = tmp_path / "run"
    recorder = Recorder([HttpSink(f"http://127.0.0.1:{port}", TOKEN)], run_dir=run_dir, **FAST)
    monitor = TrainingMonitor(recorder, model_name="m")
    async with monitor:
        recorder.step_started(0)
        for i in range(3):
            record_episode(recorder, f"t{i}")
    (line,) = recorder.undelivered()
    assert "python -m cua_native.monitor drain" in line and str(run_dir) in line
    async with ingest_server(store, port):
        (report,) = await drain(run_dir, TOKEN, None)
        assert "all delivered" in report, report
        (again,) = await drain(run_dir, TOKEN, None)
        assert "0 of 0" in again
    assert count(store, schema.Rollout) == 3 and count(store, schema.Action) == 6
    assert count(store, schema.Validation) == 3  # no client_id on the wire: never sent twice
    (training,) = _all(store, schema.Training)
    assert training.status == "completed"


async def test_a_refused_token_halts_instead_of_retrying(
    store: MonitorStore, tmp_path: Path
) -> None:
    port = free_port()
    async with ingest_server(store, port) as url:
        recorder = Recorder([HttpSink(url, "wrong")], run_dir=tmp_path / "run", **FAST)
        async with recorder:
            recorder.training_started(model_name="m")
            await wait_for(lambda: recorder.stats()["monitor/http/failures"] == 1)
            record_episode(recorder, "t")
            await wait_for(lambda: recorder.stats()["monitor/http/spilled"] > 0)
            assert recorder.stats()["monitor/http/failures"] == 1  # no retry loop
        (line,) = recorder.undelivered()
        assert "HTTP 401" in line
    with pytest.raises(ValueError, match="http"):
        HttpSink("ftp://monitor", TOKEN)
    with pytest.raises(ValueError, match="http"):
        HttpSink("monitor:8000", TOKEN)


async def test_two_evaluations_in_one_run_dir_stay_apart(
    store: MonitorStore, tmp_path: Path
) -> None:
    for _ in range(2):
        recorder = Recorder(
            [SqlSink(store, owns_store=False)],
            run_dir=tmp_path / "runs",
            run_name=new_run_name("evaluate_runs"),
            **FAST,
        )
        async with TrainingMonitor(recorder, model_name="m", total_steps=0) as monitor:
            monitor.baseline_started("m", total_tasks=1)
            context = make_context(make_task("t"), source="baseline")
            recorder.episode_started(context)
            recorder.episode_finished(finish(context, run_episode_turns(context, 1)))
            monitor.baseline_finished(success_rate=1.0)
    trainings = _all(store, schema.Training)
    baselines = _all(store, schema.Baseline)
    assert len(trainings) == 2 and len({t.run_name for t in trainings}) == 2
    assert sorted(b.training_id for b in baselines) == sorted(t.id for t in trainings)
    with store.session() as session:
        for baseline in baselines:
            rollouts = session.scalars(
                select(schema.Rollout).where(schema.Rollout.baseline_id == baseline.id)
            ).all()
            assert len(rollouts) == 1


async def test_token_first_body_cap_and_the_largest_batch_still_fits(
    store: MonitorStore, tmp_path: Path
) -> None:
    cap = 1 << 20
    app = create_app(store, token=TOKEN, max_body_bytes=cap)
    pulled = 0

    async def body() -> Any:
        nonlocal pulled
        for _ in range(64):
            pulled += 1
            yield b" " * 65536

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://m") as c:
        answer = await c.post("/api/ingest/batch", content=body())
        assert answer.status_code == 401 and pulled <= 1  # refused before the body is read
        auth = {"Authorization": f"Bearer {TOKEN}"}
        answer = await c.post("/api/ingest/batch", content=b" " * (cap + 1), headers=auth)
        assert answer.status_code == 413
    # the sink keeps its batches under half the cap: every screenshot batch still lands
    port = free_port()
    async with ingest_server(store, port) as url:
        sink = HttpSink(url, TOKEN, max_body_bytes=cap // 2)
        recorder = Recorder([sink], run_dir=tmp_path / "run", **FAST)
        async with TrainingMonitor(recorder, model_name="m"):
            context = make_context(make_task("t"))
            recorder.episode_started(context)
            noisy = [noise(i) for i in range(12)]
            for i, turn in enumerate(run_episode_turns(context, 10)):
                turn.observation = dataclasses.replace(turn.observation, screenshot=noisy[i])
                recorder.turn_finished(context, turn)
        assert recorder.stats()["monitor/http/rejected"] == 0
    assert count(store, schema.Obs) == 20


async def test_a_disk_full_to_the_end_leaves_a_true_end_for_the_next_run(
    store: MonitorStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills during the run and stays full: the store, the spill and appends to the
    ledger all refuse, so the training's end reaches no store and is lost from memory at
    exit. The ledger's end, written into the line its start reserved, keeps it; the next run
    in the directory sends it, so the training ends ``completed`` at the time it ended, not
    ``running`` forever or ``failed`` as if killed."""
    run_dir = tmp_path / "run"
    sink = SwitchSink(store)
    first = Recorder([sink], run_dir=run_dir, run_name="r1", **FAST)

    def full(*_args: Any) -> None:
        raise OSError(28, "No space left on device")

    async with TrainingMonitor(first, model_name="m"):
        await wait_for(lambda: count(store, schema.Training) == 1)  # the start was delivered
        sink.down = True  # the disk is full from here on
        monkeypatch.setattr(SpillLog, "append", full)
        monkeypatch.setattr(RunLedger, "_append", lambda self, text: None)
        record_episode(first, "t")
    (lost,) = first.undelivered()
    assert "could not be written to disk" in lost
    (training,) = _all(store, schema.Training)
    assert training.status == "running"  # what this store could not be told
    ends = [json.loads(line) for line in (run_dir / LEDGER).read_text().splitlines()]
    end = ends[-1]
    assert (end["run_name"], end["state"], end["delivered"]) == ("r1", "completed", False)

    monkeypatch.undo()  # space again
    sink.down = False
    second = Recorder([sink], run_dir=run_dir, run_name="r2", **FAST)
    async with TrainingMonitor(second, model_name="m"):
        pass
    old, new = sorted(_all(store, schema.Training), key=lambda t: t.id)
    assert (old.run_name, old.status, new.status) == ("r1", "completed", "completed")
    assert "recorded late" in (old.status_message or "") and old.error_message is None
    assert old.end_time is not None and old.end_time.isoformat().startswith(end["time"][:19])
    assert RunLedger(run_dir).ends_to_resend() == []
    third = Recorder([sink], run_dir=run_dir, run_name="r3", **FAST)
    async with TrainingMonitor(third, model_name="m"):
        pass  # an end is sent again once, not by every later run
    assert second.stats()["monitor/sql/delivered"] > third.stats()["monitor/sql/delivered"]
