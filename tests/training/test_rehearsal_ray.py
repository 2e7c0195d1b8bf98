"""The multi-node config rehearses through AReaL's ``PPOTrainer`` on AReaL's Ray scheduler.

``python -m cua_native.train --config configs/qwen3_vl_android_multinode.yaml --rehearse`` starts a
local Ray cluster; AReaL's Ray scheduler (``PatientRayScheduler``) places the FSDP actor and the
rollout worker as Ray actors, whose ``CUA_*`` environment comes from the scheduling specs; the
rollout worker reaches the gym and the stand-in SGLang server at this host's non-loopback address
(where it has one); weights go back over AReaL's xccl path (gloo on CPU). The run must exit 0 with
the Training Monitor lifecycle complete, and neither Ray (its GCS, raylet, workers) nor any other
process the run started may outlive it: after success, after an error with the actor up, and
after SIGTERM while AReaL waits on Ray.

Every process the run starts inherits ``LEAK_MARK`` (Ray's processes from the driver that starts
the local cluster), which is how leftovers are found.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from cua_native.training.cluster.rehearsal import host_address

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "qwen3_vl_android_multinode.yaml"
RUN_TIMEOUT_S = 1500
LEAK_MARK = "CUA_TEST_LEAK_MARK"
GONE_WITHIN_S = 120  # teardown is synchronous; this only absorbs load


def _marked(mark: str) -> list[str]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get(LEAK_MARK) == mark:
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _kill_marked(mark: str) -> None:
    for line in _marked(mark):
        with contextlib.suppress(psutil.Error):
            psutil.Process(int(line.split(":", 1)[0])).kill()


def _left_behind(mark: str) -> list[str]:
    left = _marked(mark)
    deadline = time.monotonic() + GONE_WITHIN_S
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _marked(mark)
    return left


def _tail(late: subprocess.TimeoutExpired) -> str:
    """What a run that overran printed, so a slow machine and a hang can be told apart."""
    text = "".join(
        part.decode(errors="replace") if isinstance(part, bytes) else part or ""
        for part in (late.stdout, late.stderr)
    )
    return text[-4000:]


def _command(run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cua_native.train",
        "--config",
        str(CONFIG),
        "--rehearse",
        "--steps",
        "2",
        "--run-dir",
        str(run_dir),
        *overrides,
    ]


def _env(mark: str) -> dict[str, str]:
    env = {**os.environ, LEAK_MARK: mark}
    env.pop("RAY_ADDRESS", None)  # the rehearsal starts its own cluster
    return env


def _rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_multinode_config_rehearses_on_a_local_ray_cluster(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    mark = uuid.uuid4().hex
    try:
        result = subprocess.run(
            _command(run_dir),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=_env(mark),
        )
    except subprocess.TimeoutExpired as late:
        _kill_marked(mark)
        pytest.fail(f"the Ray rehearsal did not finish; its output ended:\n{_tail(late)}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert _left_behind(mark) == []

    # AReaL's Ray scheduler placed both roles as Ray actors on the rehearsal's own cluster
    assert "ray: a local Ray cluster" in output
    assert "scheduler (ray)" in result.stdout
    assert "scheduler.type" not in result.stdout  # kept, not changed
    for role in ("actor", "rollout"):
        assert f"RayScheduler INFO: Creating 1 workers for role '{role}'" in output
    assert "(RayRPCServer pid=" in output  # the workers' output, forwarded by Ray
    # the stand-ins listen where a worker on another node could reach them, if this host can
    host = host_address()
    assert f"gym and stand-in server on {host}" in result.stdout
    assert f"cua.agent.gym.base_url = http://{host}:" in result.stdout
    # AReaL's collective weight update between a Ray actor and the stand-in, over gloo
    assert "weight-update mode (xccl over gloo)" in result.stdout
    assert "Initialized GLOO group for distributed weight update" in output

    db = run_dir / "monitor.db"
    assert _rows(db, "select status from training") == [("completed",)]
    steps = _rows(db, "select step, status, loss from step order by step")
    done = [s for s in steps if s[1] == "completed"]
    assert [s[0] for s in done] == [0, 1], steps
    assert all(s[2] is not None for s in done), steps
    assert _rows(db, "select status from baseline") == [("completed",)]
    assert {r[0] for r in _rows(db, "select step from eval where status = 'completed'")} == {0, 1}
    # the rollout worker (a Ray actor) recorded its episodes under the trainer's run: its
    # CUA_MONITOR_* environment came through AReaL's Ray scheduling spec
    linked = _rows(
        db,
        "select s.step, count(*) from rollout r join step s on r.step_id = s.id "
        "where r.source_type = 'step' group by s.step",
    )
    assert {0, 1} <= {step for step, _ in linked}, linked
    metrics = [json.loads(m or "{}") for (m,) in _rows(db, "select metrics_json from step")]
    assert any(m.get("rollout/cua/prompt_checks", 0) > 0 for m in metrics), metrics
    assert list((run_dir / "areal").rglob("*.safetensors"))  # AReaL's saver, from the Ray actor


def test_an_error_with_the_actor_up_leaves_no_ray_process(tmp_path: Path) -> None:
    """Two rollout servers named, one stand-in given: refused while the trainer sets up its
    rollout, after AReaL's Ray scheduler has placed and initialised the actor."""
    mark = uuid.uuid4().hex
    try:
        result = subprocess.run(
            _command(tmp_path / "run", "rollout.backend=sglang:d2"),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=_env(mark),
        )
    except subprocess.TimeoutExpired as late:
        _kill_marked(mark)
        pytest.fail(f"the failed Ray rehearsal did not exit; its output ended:\n{_tail(late)}")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "TrainController INFO: TrainController initialization complete" in output
    assert "names 1 servers but rollout.backend" in output, output[-4000:]
    assert _left_behind(mark) == []


def test_sigterm_while_areal_waits_on_ray_stops_everything(tmp_path: Path) -> None:
    """SIGTERM once AReaL's Ray scheduler is placing the actor (the trainer blocked in a Ray
    call): the run ends as terminated (143) and takes the Ray cluster with it."""
    mark = uuid.uuid4().hex
    process = subprocess.Popen(
        _command(tmp_path / "run"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(mark),
    )
    placing = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "RayScheduler INFO: Creating 1 workers for role 'actor'" in line:
                placing.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert placing.wait(RUN_TIMEOUT_S), "".join(lines)[-4000:]
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=300)
    except BaseException:
        process.kill()
        _kill_marked(mark)
        raise
    reader.join(timeout=30)
    output = "".join(lines)
    assert code == 143, output[-4000:]
    assert "rehearsal: stopped (SIGTERM)" in output, output[-4000:]
    assert _left_behind(mark) == []
