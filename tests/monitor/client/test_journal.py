"""A run killed with ``kill -9`` while it records to a local store and to a remote monitor
service (a real ``python -m cua_native.monitor serve`` process), then a rerun in the same run
directory: both stores end with the same true state for every record of the killed run
(``cua_native/monitor/client/journal.py``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from cua_native.monitor.client.events import Row
from cua_native.monitor.client.journal import JOURNAL_DIR, OpenJournal, recover

HERE = Path(__file__).parent
TOKEN = "journal-test-token"
LIMIT_S = 600.0
"""Generous bound of every wait (bounded polling of the stores; nothing is timed)."""

CHILD = """
import asyncio, sys
sys.path.insert(0, {kit!r})
from recorder_kit import finish, make_context, make_task, run_episode_turns
from cua_native.monitor.client.lifecycle import TrainingMonitor
from cua_native.monitor.client.recorder import recorder_from_config

async def main(mode: str, run_name: str) -> None:
    recorder = recorder_from_config(
        "sqlite", {url!r}, {token!r}, {run_dir!r}, run_name=run_name,
        flush_interval=0.02, backoff=(0.05, 0.2), send_timeout=600.0,
    )
    async with TrainingMonitor(recorder, model_name="m") as monitor:
        if mode == "rerun":
            return
        task = make_task("t1")
        monitor.tasks([task])
        monitor.step_started(0)
        contexts = [make_context(task, step=0) for _ in range(6)]
        for context in contexts:
            recorder.episode_started(context)
        for context in contexts[:2]:
            recorder.episode_finished(finish(context, run_episode_turns(context, 1)))
        print("phase1", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        for context in contexts[2:4]:
            recorder.episode_finished(finish(context, run_episode_turns(context, 1)))
        print("phase2", flush=True)
        await asyncio.Event().wait()  # until killed

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {LIMIT_S} s: {what}")
        time.sleep(0.05)


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    if not db.is_file():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # tables not migrated yet
            return []


def _rollouts(db: Path, run_name: str) -> dict[str, str]:
    return dict(
        _rows(
            db,
            "SELECT r.rollout_id, r.status FROM rollout r JOIN step s ON r.step_id = s.id"
            f" JOIN training t ON s.training_id = t.id WHERE t.run_name = '{run_name}'",
        )
    )


def _environments(db: Path, run_name: str) -> dict[str, str]:
    return dict(
        _rows(
            db,
            "SELECT r.rollout_id, e.status FROM environment e JOIN rollout r ON r.env_id = e.id"
            " JOIN step s ON r.step_id = s.id JOIN training t ON s.training_id = t.id"
            f" WHERE t.run_name = '{run_name}'",
        )
    )


def _training(db: Path, run_name: str) -> tuple[Any, ...] | None:
    found = _rows(db, f"SELECT status, error_message FROM training WHERE run_name = '{run_name}'")
    return found[0] if found else None


def _step(db: Path, run_name: str) -> tuple[Any, ...] | None:
    found = _rows(
        db,
        "SELECT s.status, s.error_message FROM step s JOIN training t ON s.training_id = t.id"
        f" WHERE t.run_name = '{run_name}'",
    )
    return found[0] if found else None


@pytest.fixture
def monitor_service(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """A real monitor service process over its own SQLite store."""
    port = _free_port()
    db = tmp_path / "remote" / "monitor.db"
    db.parent.mkdir()
    log = (tmp_path / "service.log").open("wb")
    service = subprocess.Popen(
        [
            *(sys.executable, "-m", "cua_native.monitor", "serve", "--db", f"sqlite:///{db}"),
            *("--run-dir", str(db.parent), "--port", str(port), "--token", TOKEN),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert service.poll() is None, (tmp_path / "service.log").read_text()
        try:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            return httpx.get(f"{url}/healthz", headers=auth, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _until(ready, "the monitor service answers")
        yield url, db, service
    finally:
        service.send_signal(signal.SIGCONT)
        service.terminate()
        try:
            service.wait(timeout=60)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()


def _line(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline().strip()


def test_kill_9_then_a_rerun_leaves_both_stores_true_and_agreeing(
    tmp_path: Path, monitor_service: tuple[str, Path, subprocess.Popen[bytes]]
) -> None:
    url, remote, service = monitor_service
    run_dir = tmp_path / "run"
    local = run_dir / "monitor.db"
    script = tmp_path / "child.py"
    script.write_text(
        CHILD.format(kit=str(HERE), url=url, token=TOKEN, run_dir=str(run_dir)), encoding="utf-8"
    )
    killed = "killed-run"
    child = subprocess.Popen(
        [sys.executable, str(script), "train", killed],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert _line(child.stdout) == "phase1"

        def phase1_everywhere() -> bool:
            return all(
                len(r := _rollouts(db, killed)) == 6 and sorted(r.values()).count("completed") == 2
                for db in (local, remote)
            )

        _until(phase1_everywhere, "6 rollouts, 2 completed, in both stores")
        service.send_signal(signal.SIGSTOP)  # the remote monitor stops answering
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert _line(child.stdout) == "phase2"
        _until(
            lambda: list(_rollouts(local, killed).values()).count("completed") == 4,
            "4 rollouts completed in the local store",
        )
        # the stores disagree now: the remote never got the last two ends
        assert list(_rollouts(remote, killed).values()).count("completed") == 2
        journals = list((run_dir / JOURNAL_DIR).glob("*.jsonl"))
        assert len(journals) == 1
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=LIMIT_S) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        service.send_signal(signal.SIGCONT)
    rerun = subprocess.run(
        [sys.executable, str(script), "rerun", "rerun"],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert "not delivered" not in rerun.stderr, rerun.stderr
    for db in (local, remote):
        rollouts = _rollouts(db, killed)
        assert sorted(rollouts.values()) == ["completed"] * 4 + ["interrupted"] * 2, (db, rollouts)
        environments = _environments(db, killed)
        assert sorted(environments.values()) == ["interrupted"] * 2 + ["terminated"] * 4, (
            db,
            environments,
        )
        for rollout_id, status in rollouts.items():  # an open rollout's environment too
            assert (environments[rollout_id] == "interrupted") == (status == "interrupted")
        status, error = _training(db, killed) or (None, None)
        assert status == "interrupted" and "killed" in (error or ""), (db, status, error)
        step_status, step_error = _step(db, killed) or (None, None)
        assert step_status == "failed" and "interrupted" in (step_error or "")
        assert _training(db, "rerun") == ("completed", None)
    assert _rollouts(local, killed) == _rollouts(remote, killed)
    assert _environments(local, killed) == _environments(remote, killed)
    assert list((run_dir / JOURNAL_DIR).glob("*.jsonl")) == []  # adopted, then the rerun ended
    ledger = [
        json.loads(line)
        for line in (run_dir / "monitor_runs.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert any(e["run_name"] == killed and e["state"] == "interrupted" for e in ledger)


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_a_torn_last_line_is_skipped_and_ended_records_keep_their_end(tmp_path: Path) -> None:
    journal = OpenJournal(tmp_path, "dead")
    journal.append(
        [
            Row("rollouts", "r1", {"status": "running"}),
            Row("rollouts", "r2", {"status": "running"}),
            Row("environments", "r1:env", {"status": "running"}),
            Row("turns", "r1:turn:1", {"thought": "not journaled"}),
        ]
    )
    journal.append([Row("rollouts", "r2", {"status": "completed", "reward": 1.0})])
    assert journal._handle is not None
    journal._handle.close()
    text = journal.path.read_text().replace(f'"pid": {os.getpid()}', f'"pid": {_dead_pid()}')
    journal.path.write_text(text + '{"kind": "rollouts", "client_id": "r3", "fie')  # the kill
    found = recover(tmp_path, "next", alive=lambda pid: False)
    states = {(r.kind, r.client_id): r.fields.get("status") for r in found.rows}
    assert states == {
        ("rollouts", "r1"): "interrupted",
        ("rollouts", "r2"): "completed",
        ("environments", "r1:env"): "interrupted",
    }
    assert found.runs == {"dead"} and found.journals == [journal.path]
    assert recover(tmp_path, "dead", alive=lambda pid: False).rows == []  # its own run: no
