"""``configs/desktop.yaml``: its train and eval splits of the desktop tasks, and the two commands
its header names run for real on local desktops with the tiny model (CPU):
``python -m cua_native.evaluate --config configs/desktop.yaml --episodes 4 --json`` and
``python -m cua_native.train --config configs/desktop.yaml --steps 2``. Each run's desktops live
under its own ``$TMPDIR``: nothing of them may be left when the command ends. Skipped without
``.ci/desktop.sh``."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cua_native.config import load_config
from cua_native.gym.desktop.local import default_server_python
from cua_native.gym.desktop.tasks import DEFAULT_TASK_FILE, load_tasks
from cua_native.rollout.dataset import load_tasks as select_from_source
from cua_native.rollout.factories import make_gym

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "desktop.yaml"
RUN_TIMEOUT_S = 1200
"""A bound for a broken run only: a loaded 2-core machine runs these several times slower."""
needs_desktop = pytest.mark.skipif(
    shutil.which("Xvfb") is None or not Path(default_server_python()).exists(),
    reason="local desktops need `source .ci/desktop.sh` (Xvfb, apps, .venv-desktop)",
)


async def test_the_train_and_eval_splits_partition_the_desktop_tasks() -> None:
    cua = load_config(CONFIG).cua
    gym = make_gym(cua.agent.gym)
    assert cua.eval_tasks is not None
    train = {t.task_id for t in await select_from_source(cua.tasks, gym)}
    evals = {t.task_id for t in await select_from_source(cua.eval_tasks, gym)}
    await gym.aclose()
    assert train.isdisjoint(evals)
    assert train | evals == {t.task_id for t in load_tasks(DEFAULT_TASK_FILE)}
    assert len(evals) == round(0.25 * len(train | evals))
    assert cua.agent.family == "qwen3_vl" and cua.agent.gym.kind == "desktop"


def _run(module: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path / "tmp"))
    return subprocess.run(
        [sys.executable, "-m", module, "--config", str(CONFIG), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )


def _no_desktop_left(tmp_path: Path) -> None:
    root = tmp_path / "tmp" / "cua_native_desktops"
    assert not root.exists() or list(root.iterdir()) == []


def _screenshot_sizes(run_dir: Path) -> set[tuple[int, int]]:
    with sqlite3.connect(run_dir / "monitor.db") as db:
        rows = db.execute("select width, height from obs").fetchall()
    pngs = list((run_dir / "screenshots").rglob("*.png"))
    assert pngs, "the monitor stored no screenshot"
    stored = {struct.unpack(">II", png.read_bytes()[16:24]) for png in pngs}
    return {(int(w), int(h)) for w, h in rows} | stored


@needs_desktop
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_evaluate_runs_on_local_desktops(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "desktop"
    done = _run(
        "cua_native.evaluate",
        tmp_path,
        "--episodes",
        "4",
        "--json",
        "--no-progress",
        "--run-dir",
        str(run_dir),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 4 and summary["completed"] == 4, summary
    assert summary["rejected"] == 0 and summary["leaked_executions"] == 0, summary
    assert _screenshot_sizes(run_dir) == {(1024, 768)}  # the real screen, on the monitor
    _no_desktop_left(tmp_path)


@needs_desktop
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_train_runs_two_steps_on_local_desktops(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "desktop"
    done = _run(
        "cua_native.train", tmp_path, "--steps", "2", "--no-progress", "--run-dir", str(run_dir)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("step episodes"))
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [row[:2] for row in rows] == [["0", "4"], ["1", "4"]], lines[header : header + 3]
    assert (run_dir / "checkpoints" / "version-2" / "config.json").is_file()
    assert _screenshot_sizes(run_dir) == {(1024, 768)}
    _no_desktop_left(tmp_path)
