"""``python -m cua_native.monitor tasks``: a run's success per task, read back from the monitor
database the real recorder wrote (baseline, training steps by block, evaluations)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from recorder_kit import finish, make_context, make_task, run_episode_turns

from cua_native.monitor.__main__ import main
from cua_native.monitor.client.lifecycle import TrainingMonitor
from cua_native.monitor.client.recorder import Recorder
from cua_native.monitor.client.sinks import SqlSink
from cua_native.monitor.db.store import MonitorStore
from cua_native.monitor.service.tasks import action_label, column_of

FAST = {"flush_interval": 0.02, "backoff": (0.05, 0.2), "send_timeout": 120.0}


def record(recorder: Recorder, task_id: str, source: str, step: int, success: bool) -> None:
    context = make_context(make_task(task_id), step=step, source=source)
    recorder.episode_started(context)
    turns = run_episode_turns(context, 2)
    for turn in turns:
        recorder.turn_finished(context, turn)
    episode = finish(context, turns)
    episode.success = success
    episode.reward = float(success)
    assert episode.evaluation is not None
    episode.evaluation = replace(episode.evaluation, success=success)
    recorder.episode_finished(episode)


async def test_the_table_reads_what_the_recorder_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MonitorStore.open(None, run_dir=tmp_path / "run")
    recorder = Recorder([SqlSink(store)], run_dir=tmp_path / "run", **FAST)
    async with recorder:
        with TrainingMonitor(recorder, model_name="tiny", total_steps=12):
            recorder.tasks_registered([make_task("t1"), make_task("t2")])
            recorder.baseline_started("base")
            record(recorder, "t1", "baseline", 0, False)
            record(recorder, "t2", "baseline", 0, True)
            recorder.baseline_finished()
            for step, success in ((0, False), (11, True)):
                recorder.step_started(step)
                record(recorder, "t1", "step", step, success)
                recorder.step_finished(step, loss=0.0, kl=0.0, reward_mean=0.0, num_tokens=1)
            recorder.eval_started(11, "ckpt")
            record(recorder, "t1", "eval", 11, True)
            record(recorder, "t2", "eval", 11, True)
            recorder.eval_finished(11)
    assert recorder.stats()["monitor/dropped"] == 0
    db = tmp_path / "run" / "monitor.db"

    assert main(["tasks", str(db), "--show", "t1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["task", "base", "t00", "t10", "e11"]
    assert lines[2].split() == ["t1", "0%", "0%", "100%", "100%"]
    assert lines[3].split() == ["t2", "100%", "-", "-", "100%"]
    assert lines[4] == "== t1 base" and lines[6] == "== t1 e11"
    assert lines[5] == "  terminate: click:0.25,0.50 | click:0.25,0.50   [tap 0]"


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", str(tmp_path / "missing.db")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {tmp_path / 'missing.db'}: no such database file"
    )
    (tmp_path / "monitor.db").write_bytes(b"")
    assert main(["tasks", str(tmp_path / "monitor.db"), "--block", "0"]) == 2


def test_columns_and_labels() -> None:
    assert column_of("baseline", None, None, 10) == "base"
    assert column_of("eval", None, 9, 10) == "e9"
    assert column_of("step", 23, None, 10) == "t20"
    assert action_label('{"type": "open_app", "name": "Notes"}', None) == "open_app:Notes"
    assert action_label('{"type": "hotkey", "keys": ["ctrl", "s"]}', None) == "hotkey:ctrl+s"
    assert action_label(None, "no tool call") == "ERR"
