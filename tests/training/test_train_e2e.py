"""``python -m cua_native.train`` end to end on the embedded default (shrunk to seconds), and
the cluster path's plan against the simulator served over real HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from cua_native.config import load_config
from cua_native.training.cluster.run import WORKFLOW_PATH, plan_cluster_run

ROOT = Path(__file__).resolve().parents[2]


def _run_train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable,
        "-m",
        "cua_native.train",
        "--run-dir",
        str(run_dir),
        "--steps",
        "2",
        "--no-progress",
        "cua.warm_start.steps=3",
        "cua.warm_start.batch_size=2",
        "cua.agent.group_size=2",
        "cua.agent.max_turns=2",
        "cua.eval_every=2",
        "cua.tasks.limit=2",
        "cua.eval_tasks.limit=1",
        "cua.eval_tasks.gym_seeds=[1000]",
        "train_dataset.batch_size=1",
        "saver.freq_steps=1",
        "cua.eval_episodes_per_task=3",
        # a 3-step warm start fails every episode alike: every group would be skipped and no
        # step would update (tests/training/test_uniform_groups.py covers the skip)
        "cua.skip_uniform_groups=false",
        *extra,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env
    )


RUN_TIMEOUT_S = 1500
"""A bound for a broken run only: a loaded 2-core CI machine runs this one many times slower."""


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.slow
def test_embedded_default_trains_and_records_everything(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "e2e"
    done = _run_train(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "run directory:" in out and "dashboard:" in out and "checkpoint:" in out
    assert (run_dir / "reward_curve.png").stat().st_size > 0
    assert "gain (last eval - baseline):" in out and "paired 95% CI over 1 tasks" in out
    # without progress bars each step's row and each evaluation print as they happen, once
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("step episodes"))
    assert sum(line.lstrip().startswith("step episodes") for line in lines) == 1
    assert lines[header - 1].startswith("baseline: success ")
    rows = [line.split()[0] for line in lines[header + 1 : header + 4]]
    assert rows == ["0", "1", "eval"], lines[header - 1 : header + 4]
    evals = json.loads((run_dir / "evals.json").read_text())
    assert [p["step"] for p in evals["points"]] == [-1, 1]
    checkpoint = run_dir / "checkpoints" / "version-2"
    assert (checkpoint / "config.json").is_file(), "two steps → weights version 2 saved"
    assert (run_dir / "checkpoints" / "version-1" / "config.json").is_file(), "saver.freq_steps=1"

    db = create_engine(f"sqlite:///{run_dir / 'monitor.db'}")
    with db.connect() as c:
        status = c.execute(text("select status from training")).scalar_one()
        steps = c.execute(text("select step, status, reward_mean from step order by step")).all()
        rollouts = c.execute(text("select source_type, status from rollout")).all()
        actions = c.execute(text("select tokens, logprobs, num_tokens from action")).all()
        screenshots = c.execute(text("select count(*) from obs")).scalar_one()
        baselines = c.execute(text("select status from baseline")).all()
        checkpoints = c.execute(text("select checkpoint_path from step order by step")).scalars()
        checkpoints = list(checkpoints)
    assert status == "completed"
    assert [(s, st) for s, st, _ in steps] == [(0, "completed"), (1, "completed")]
    assert all(r is not None for _, _, r in steps)
    sources = {s for s, _ in rollouts}
    assert {"step", "baseline", "eval"} <= sources
    assert actions, "every turn's action is recorded"
    tokens, logprobs, count = actions[0]
    tokens, logprobs = json.loads(tokens), json.loads(logprobs)
    assert len(tokens) == len(logprobs) == count > 0
    assert {"id", "text"} <= set(tokens[0])
    assert all(lp <= 0.0 for lp in logprobs)
    assert screenshots > 0
    assert [b for (b,) in baselines] == ["completed"]
    assert sum(s == "baseline" for s, _ in rollouts) == 3, "eval_episodes_per_task on 1 eval task"
    assert checkpoints == [str(run_dir / "checkpoints" / f"version-{v}") for v in (1, 2)]


def test_wrong_config_stops_before_anything_starts(tmp_path: Path) -> None:
    done = _run_train(tmp_path / "runs" / "bad", "cua.agent.max_turnz=3")
    assert done.returncode == 2
    assert "Did you mean 'max_turns'?" in done.stderr
    assert not (tmp_path / "runs" / "bad").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sim_server() -> str:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cua_native.gym.server", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a loaded machine imports slowly
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None:
                pytest.fail(f"gym server exited: {proc.stderr.read() if proc.stderr else ''}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cluster_plan_against_a_real_gym_server(
    sim_server: str, tmp_path: Path, processor: Any
) -> None:
    loaded = load_config(
        ROOT / "configs" / "mai_ui_android.yaml",
        [
            f"cua.agent.gym.base_url={sim_server}",
            "cua.agent.gym.gym_id=sim",
            f"cua.run_dir={tmp_path}",
            "actor.path=/models/MAI-UI-8B",
            # the tiny processor's budget stands in for MAI-UI-8B's
            "cua.agent.prompt.max_pixels=131072",
            "cua.eval_temperature=0.25",
        ],
    )
    # the pixel budget is checked against the model's processor (the tiny model's stands in)
    plan = plan_cluster_run(loaded, processor)
    assert len(plan.train_rows) + len(plan.eval_rows) == 33
    assert {r["gym_id"] for r in plan.train_rows} == {"sim"}
    assert (
        plan.workflow_kwargs["source"] == "step" and plan.eval_workflow_kwargs["source"] == "eval"
    )
    assert plan.workflow_kwargs["config"]["model_path"] == "/models/MAI-UI-8B"
    assert (
        plan.workflow_kwargs["observer_factory"]
        == "cua_native.monitor.client.worker.observer_from_env"
    )
    assert plan.worker_env["CUA_MONITOR_URL"] == loaded.cua.monitor_url
    assert plan.worker_env["MALLOC_TRIM_THRESHOLD_"].isdigit()
    assert plan.worker_env["MALLOC_ARENA_MAX"] == "1"
    assert plan.baseline_workflow_kwargs["source"] == "baseline"

    from areal.utils.dynamic_import import import_from_string

    workflow = import_from_string(WORKFLOW_PATH)(**plan.workflow_kwargs)
    assert workflow.config.gym.base_url == sim_server
    # trained rows cross AReaL's process boundary compact; evaluation rows are never trained
    assert workflow.compact_pixels and "compact_pixels" not in plan.eval_workflow_kwargs
    assert workflow.config.group_size == 8
    assert plan.eval_workflow_kwargs["config"]["group_size"] == loaded.cua.eval_episodes_per_task
    # evaluations sample at cua.eval_temperature, training at the agent's temperature
    assert plan.eval_workflow_kwargs["config"]["sampling"]["temperature"] == 0.25
    assert plan.eval_workflow_kwargs["config"]["model_path"] == "/models/MAI-UI-8B"
    assert (
        plan.workflow_kwargs["config"]["sampling"]["temperature"]
        == loaded.cua.agent.sampling.temperature
        != 0.25
    )


def test_cluster_plan_carries_the_credit_switches(
    sim_server: str, tmp_path: Path, processor: Any
) -> None:
    """The cluster path's rollout workers build the workflow from these kwargs: the switches
    travel with the step's agent; evaluations run without them."""
    credit = "cua.agent.credit"
    loaded = load_config(
        ROOT / "configs" / "mai_ui_android.yaml",
        [
            f"cua.agent.gym.base_url={sim_server}",
            "cua.agent.gym.gym_id=sim",
            f"cua.run_dir={tmp_path}",
            "actor.path=/models/MAI-UI-8B",
            "cua.agent.prompt.max_pixels=131072",
            f"{credit}.branch.enabled=true",
            f"{credit}.branch.trigger=schedule",
            f"{credit}.anchor.enabled=true",
            f"{credit}.replay.enabled=true",
            f"{credit}.dynamic_sampling=true",
        ],
    )
    plan = plan_cluster_run(loaded, processor)
    from areal.utils.dynamic_import import import_from_string

    step = import_from_string(WORKFLOW_PATH)(**plan.workflow_kwargs).config.credit
    assert step.branch.enabled and step.branch.trigger == "schedule"
    assert step.anchor.enabled and step.replay.enabled and step.dynamic_sampling
    for kwargs in (plan.eval_workflow_kwargs, plan.baseline_workflow_kwargs):
        assert not import_from_string(WORKFLOW_PATH)(**kwargs).config.credit.any


CREDIT = "cua.agent.credit"


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_embedded_trainer_runs_every_credit_switch(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "credit"
    done = _run_train(
        run_dir,
        f"{CREDIT}.branch.enabled=true",
        f"{CREDIT}.branch.trigger=schedule",
        f"{CREDIT}.branch.turns=[1]",
        f"{CREDIT}.branch.max_points=1",
        f"{CREDIT}.anchor.enabled=true",
        f"{CREDIT}.replay.enabled=true",
        f"{CREDIT}.dynamic_sampling=true",
        f"{CREDIT}.dynamic_rounds=1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("step episodes"))
    assert header.split()[-5:] == ["branch", "+env", "env", "signal", "replay"]
    train = json.loads((run_dir / "evals.json").read_text())["train"]
    assert [s["step"] for s in train] == [0, 1]
    for s in train:
        # one task a step (train_dataset.batch_size=1), one more round at most
        assert 1 <= s["groups"] <= 2
        assert s["signal_groups"] <= s["groups"]
        # the budget: one branch point a group, one sibling, at most max_turns (2) turns
        assert s["branch_points"] <= s["groups"]
        assert s["extra_env_steps"] <= 2 * s["branch_points"]
        assert s["env_steps"] >= s["episodes"] > 0
    db = create_engine(f"sqlite:///{run_dir / 'monitor.db'}")
    with db.connect() as c:
        metrics = c.execute(text("select metrics_json from step order by step")).scalars().all()
    recorded = [json.loads(m or "{}") for m in metrics]
    assert all("credit/env_steps" in m and "credit/signal_groups" in m for m in recorded), recorded
