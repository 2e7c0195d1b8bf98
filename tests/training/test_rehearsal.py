"""Every shipped cluster config rehearses through AReaL's ``PPOTrainer`` on CPU (issue 12).

``python -m cua_native.train --config CONFIG --rehearse --steps 2`` runs AReaL's real trainer
path: its local scheduler starts an FSDP actor worker and a rollout worker, the rollout worker's
AReaL remote engine client talks to the stand-in server of the configured backend
(``cua_native.engine.serve``), weights go back to the server through the config's ``xccl``
update (AReaL's broadcast, over gloo on CPU), AReaL's
evaluator runs the eval rollout and its saver the checkpoint. The run must exit 0 and leave the
Training Monitor lifecycle in RUN_DIR/monitor.db.

Each run takes a few minutes on a 2-core machine (worker start-up dominates).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REHEARSED = [
    "qwen3_vl_android.yaml",
    "mai_ui_android.yaml",
    "qwen3_vl_linux.yaml",
    "qwen3_vl_android_vllm.yaml",
]
DISK_UPDATES = "mai_ui_android.yaml"
RUN_TIMEOUT_S = 1500


def _rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.parametrize("name", REHEARSED)
def test_cluster_config_rehearses_through_ppo_trainer(name: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # one config's rehearsal takes disk weight updates (a user's override wins over the
    # config): both update paths run through AReaL's trainer in every CI run
    disk = name == DISK_UPDATES
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cua_native.train",
            "--config",
            str(CONFIGS / name),
            "--rehearse",
            "--steps",
            "2",
            "--run-dir",
            str(run_dir),
            *(["actor.weight_update_mode=disk"] if disk else []),
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    out = result.stdout
    # what it changed, said aloud
    assert "kept: backend" in out
    # the config's xccl weight update runs AReaL's collective path, over gloo on CPU: the actor
    # broadcasts, the stand-in receives under SGLang's / vLLM's parameter names
    rollout_logs = "".join(p.read_text() for p in (run_dir / "areal").rglob("rollout.log"))
    assert "actor.weight_update_mode" not in out  # rehearsal changes no update mode on CPU
    if disk:
        assert "weight-update mode (disk)" in out
        assert "Initialized GLOO group" not in rollout_logs
    else:
        assert "weight-update mode (xccl over gloo)" in out
        assert "Initialized GLOO group for distributed weight update" in rollout_logs
    backend = "vllm" if "vllm" in name else "sglang"
    assert f"rollout.backend = {backend}:d1" in out

    db = run_dir / "monitor.db"
    (status,) = _rows(db, "select status from training")
    assert status == ("completed",)
    steps = _rows(db, "select step, status, loss from step order by step")
    done = [s for s in steps if s[1] == "completed"]
    assert [s[0] for s in done] == [0, 1], steps
    assert all(s[2] is not None for s in done), steps
    # step 0 trains rows the first weights generated: the actor's recomputed log-probs (its
    # screenshots sent across AReaL's process boundary compact, rollout/pixel_palette.py, and
    # expanded in the actor) equal the engine's
    (metrics,) = _rows(db, "select metrics_json from step where step = 0")
    kl = {k: v for k, v in json.loads(metrics[0]).items() if "compute_logp/kl_div_direct" in k}
    assert kl and max(abs(v) for v in kl.values()) <= 1e-5, kl
    # AReaL keeps generating ahead (max_head_offpolicyness): episodes made with the last
    # weights belong to a step that never trains. The training's end closes it, saying so,
    # and cancels its rollouts still running (those that finished first stay completed, a
    # true state: which ones finish is a race with the last train step): no row is left open
    assert all(s[0] == 2 and s[1] == "failed" for s in steps if s not in done), steps
    never = _rows(db, "select error_message from step where status = 'failed'")
    assert all("never trained" in m for (m,) in never), never
    ended = {"completed", "failed", "cancelled"}
    assert {r for (r,) in _rows(db, "select status from rollout")} <= ended
    ahead = _rows(
        db, "select r.status from rollout r join step s on r.step_id = s.id where s.step = 2"
    )
    assert {status for (status,) in ahead} <= {"completed", "cancelled"}, ahead
    assert {e for (e,) in _rows(db, "select status from environment")} == {"terminated"}
    # every turn's prompt was checked against what the server reported (AReaL's remote client
    # carries cua_native.engine.remote's backend, installed by the workflow; on vLLM the one
    # that restarts aborted chat turns)
    metrics = [json.loads(m or "{}") for (m,) in _rows(db, "select metrics_json from step")]
    assert any(m.get("rollout/cua/prompt_checks", 0) > 0 for m in metrics), metrics
    assert not any(m.get("rollout/cua/token_mismatches", 0) for m in metrics), metrics
    assert _rows(db, "select status from baseline") == [("completed",)]
    assert {r[0] for r in _rows(db, "select step from eval where status = 'completed'")} == {0, 1}
    # rollouts linked to the step whose weights generated them
    linked = _rows(
        db,
        "select s.step, count(*) from rollout r join step s on r.step_id = s.id "
        "where r.source_type = 'step' group by s.step",
    )
    assert {0, 1} <= {step for step, _ in linked} <= {0, 1, 2}, linked
    # AReaL's saver wrote the checkpoint of the last step
    assert list((run_dir / "areal").rglob("model.safetensors")) or list(
        (run_dir / "areal").rglob("*.safetensors")
    )


LEAK_MARK = "CUA_TEST_LEAK_MARK"


def _marked(mark: str) -> list[str]:
    """Processes (pid and command) whose environment carries ``LEAK_MARK=mark``."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get(LEAK_MARK) == mark:
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])[:200]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_an_early_failure_leaves_no_worker_processes(tmp_path: Path) -> None:
    """``rollout.backend=sglang:d2`` with one stand-in server is refused while the trainer sets
    up its rollout, after AReaL's scheduler has started and initialised the actor worker: the
    run fails, and no process it started (workers, gym, stand-in server) outlives it."""
    import os
    import time
    import uuid

    import psutil

    mark = uuid.uuid4().hex
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "cua_native.train",
                "--config",
                str(CONFIGS / "qwen3_vl_android.yaml"),
                "--rehearse",
                "--steps",
                "1",
                "--run-dir",
                str(tmp_path / "run"),
                "rollout.backend=sglang:d2",
            ],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env={**os.environ, LEAK_MARK: mark},
        )
    except subprocess.TimeoutExpired:
        # without the cleanup AReaL's scheduler tears its workers down from ``__del__`` at
        # interpreter exit, which hangs: stop what this test started, then fail
        for line in _marked(mark):
            with contextlib.suppress(psutil.Error):
                psutil.Process(int(line.split(":", 1)[0])).kill()
        pytest.fail("the failed run did not exit (workers left running)")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "Worker actor/0 started" in output, output[-4000:]  # failed with workers up
    assert "names 1 servers but rollout.backend" in output, output[-4000:]
    left = _marked(mark)
    deadline = time.monotonic() + 120  # bounded: teardown is synchronous, this only absorbs load
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _marked(mark)
    assert left == [], left
