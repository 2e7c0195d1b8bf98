"""``configs/desktop.yaml``: its train and eval splits of the desktop tasks, and the two commands
its header names run for real on local desktops with the tiny model (CPU), and its trainer
killed with ``kill -9`` leaves desktops that the next start reaps:
``python -m cua_native.evaluate --config configs/desktop.yaml --episodes 4 --json`` and
``python -m cua_native.train --config configs/desktop.yaml --steps 2``. Each run's desktops live
under its own ``$TMPDIR``: nothing of them may be left when the command ends. Skipped without
``.ci/desktop.sh``."""

from __future__ import annotations

import asyncio
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
from cua_native.gym.desktop import reaper
from cua_native.gym.desktop.local import LocalDesktop, LocalDesktopConfig, default_server_python
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


def _run(module: str, tmp: Path, run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    return subprocess.run(
        [sys.executable, "-m", module, "--config", str(CONFIG), "--run-dir", str(run_dir), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )


def _no_desktop_left(tmp: Path) -> None:
    root = tmp / "cua_native_desktops"
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
def test_evaluate_runs_on_local_desktops(short_tmp: Path) -> None:
    run_dir = short_tmp / "runs" / "desktop"
    done = _run(
        "cua_native.evaluate",
        short_tmp,
        run_dir,
        *("--episodes", "4", "--json", "--no-progress", "cua.warm_start.enabled=false"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # --episodes is per eval task (cua.eval_episodes_per_task): 4 on each of the 10 eval tasks
    assert summary["episodes"] == 40 and summary["completed"] == 40, summary
    assert summary["rejected"] == 0 and summary["leaked_executions"] == 0, summary
    assert _screenshot_sizes(run_dir) == {(1024, 768)}  # the real screen, on the monitor
    _no_desktop_left(short_tmp)


@needs_desktop
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_train_runs_two_steps_on_local_desktops(short_tmp: Path) -> None:
    run_dir = short_tmp / "runs" / "desktop"
    done = _run(
        "cua_native.train", short_tmp, run_dir, "--steps", "2", "--no-progress", "--no-warm-start"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("step episodes"))
    # the step rows, between whatever else the run logs to stdout (AReaL's lines)
    rows = [
        row for row in (line.split() for line in lines[header + 1 :]) if row[:1] in (["0"], ["1"])
    ]
    assert [row[:2] for row in rows] == [["0", "4"], ["1", "4"]], lines[header:]
    assert (run_dir / "checkpoints" / "version-2" / "config.json").is_file()
    assert _screenshot_sizes(run_dir) == {(1024, 768)}
    _no_desktop_left(short_tmp)


@needs_desktop
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_train_warm_starts_on_desktop_demonstrations(short_tmp: Path) -> None:
    """The warm start of ``configs/desktop.yaml`` (here on three of its tasks, one of them
    infeasible, and a few steps): the demonstrator's episodes on local desktops become SFT rows,
    the trainer starts from the warm-started model, and no desktop is left."""
    run_dir = short_tmp / "runs" / "desktop"
    tasks = ["terminal_hello_file", "editor_save_note", "terminal_infeasible_camera"]
    done = _run(
        "cua_native.train",
        short_tmp,
        run_dir,
        *("--steps", "1", "--no-progress", "cua.warm_start.steps=3", "cua.tasks.split=all"),
        f"cua.tasks.task_ids=[{','.join(tasks)}]",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [warm] = list((run_dir.parent / ".cache").glob("tiny-qwen3-vl-warm-qwen3_vl-*"))
    report = json.loads((warm / "cua_native_warm_start.json").read_text())
    # terminal: type + done; editor: type, ctrl+s, done; infeasible: terminate(failure)
    assert (report["tasks"], report["demos"], report["steps"]) == (3, 6, 3), report
    assert (run_dir / "checkpoints" / "version-1" / "config.json").is_file()
    _no_desktop_left(short_tmp)


@needs_desktop
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
async def test_kill_9_of_the_trainer_is_reaped_by_the_next_start(short_tmp: Path) -> None:
    """The trainer of ``configs/desktop.yaml`` killed with ``kill -9`` while its desktops are
    live: they outlive it (nothing ran in it to clean up) until the next start, in another
    process, reaps every one of them."""
    root = short_tmp / "cua_native_desktops"
    env = dict(os.environ, TMPDIR=str(short_tmp))
    trainer = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "cua_native.train", "--config", str(CONFIG), "--steps", "2", "--no-progress"),
        *("--run-dir", str(short_tmp / "runs" / "desktop")),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):  # until one of its desktops serves
            while not (root.exists() and any(root.glob("*/server.sock"))):
                assert trainer.returncode is None, "the trainer ended before a desktop started"
                await asyncio.sleep(0.2)
    finally:
        trainer.kill()  # SIGKILL
        await trainer.wait()
    left = [d.name for d in root.iterdir()]
    assert left and all(d.startswith(f"{trainer.pid}-") for d in left)
    assert any(reaper.marked_pids(d) for d in left), "its desktops outlived it until reaped"
    desktop = await LocalDesktop.start(LocalDesktopConfig(width=640, height=480, state_root=root))
    try:
        assert [d.name for d in root.iterdir()] == [desktop.desktop_id]
        assert all(reaper.marked_pids(d) == [] for d in left)
    finally:
        await desktop.close()
    assert list(root.iterdir()) == []
