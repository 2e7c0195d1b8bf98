"""Every shipped cluster config rehearses through AReaL's ``PPOTrainer`` on CPU (issue 12).

``python -m cua_native.train --config CONFIG --rehearse --steps 2`` runs AReaL's real trainer
path: its local scheduler starts an FSDP actor worker and a rollout worker, the rollout worker's
AReaL remote engine client talks to the stand-in server of the configured backend
(``cua_native.engine.serve``), weights go back to the server through disk updates, AReaL's
evaluator runs the eval rollout and its saver the checkpoint. The run must exit 0 and leave the
Training Monitor lifecycle in RUN_DIR/monitor.db.

Each run takes a few minutes on a 2-core machine (worker start-up dominates).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REHEARSED = [
    "qwen3_vl_android.yaml",
    "mai_ui_android.yaml",
    "qwen3_vl_linux.yaml",
    "qwen3_vl_android_vllm.yaml",
]
RUN_TIMEOUT_S = 1500


def _rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.parametrize("name", REHEARSED)
def test_cluster_config_rehearses_through_ppo_trainer(name: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable, "-m", "cua_native.train", "--config", str(CONFIGS / name),
            "--rehearse", "--steps", "2", "--run-dir", str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    out = result.stdout
    # what it changed, said aloud
    assert "actor.weight_update_mode = disk  (NCCL (xccl) needs GPUs: disk on CPU)" in out
    assert "kept: backend" in out
    backend = "vllm" if "vllm" in name else "sglang"
    assert f"rollout.backend = {backend}:d1" in out

    db = run_dir / "monitor.db"
    (status,) = _rows(db, "select status from training")
    assert status == ("completed",)
    steps = _rows(db, "select step, status, loss from step order by step")
    done = [s for s in steps if s[1] == "completed"]
    assert [s[0] for s in done] == [0, 1], steps
    assert all(s[2] is not None for s in done), steps
    # AReaL keeps generating ahead (max_head_offpolicyness): episodes made with the last
    # weights belong to a step that never trains, which stays pending
    assert all(s[0] == 2 and s[1] == "pending" for s in steps if s not in done), steps
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
