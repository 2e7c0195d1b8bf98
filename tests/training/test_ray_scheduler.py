"""``PatientRayScheduler`` against AReaL 1.0.4's ``RayScheduler``: the environment a Ray worker
is started with (``runtime_env``'s ``env_vars``), built by each from the same scheduling spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from areal.api.cli_args import SchedulingSpec
from areal.infra.scheduler.ray import RayScheduler

from cua_native.config import load_config
from cua_native.training.cluster.local_scheduler import FORK_READY_TIMEOUT_S
from cua_native.training.cluster.ray_scheduler import PatientRayScheduler, patient_ray_scheduler

MULTINODE = Path(__file__).resolve().parents[2] / "configs" / "qwen3_vl_android_multinode.yaml"
TOKEN = "dG9rZW4=,x"  # base64 padding and a comma: both are AReaL's separators
DB = "postgresql://cua@db.internal/cua?sslmode=require"


def _spec() -> SchedulingSpec:
    return SchedulingSpec(
        cpu=2,
        env_vars={"CUA_MONITOR_TOKEN": TOKEN, "CUA_MONITOR_DB": DB, "OMP_NUM_THREADS": "3"},
    )


def test_areal_cuts_values_holding_its_separators() -> None:
    with pytest.raises(ValueError, match="dictionary update sequence"):
        RayScheduler(exp_config=load_config(MULTINODE).areal)._build_env_vars(_spec())


def test_values_reach_the_worker_whole_with_areals_precedence() -> None:
    scheduler = patient_ray_scheduler(load_config(MULTINODE).areal)
    assert isinstance(scheduler, PatientRayScheduler)
    assert scheduler.startup_timeout == FORK_READY_TIMEOUT_S
    env = scheduler._build_env_vars(_spec())
    assert env["CUA_MONITOR_TOKEN"] == TOKEN
    assert env["CUA_MONITOR_DB"] == DB
    assert env["OMP_NUM_THREADS"] == "3"  # the spec's own setting wins
    # AReaL's base environment is still there: the workers import what the trainer imports
    plain = RayScheduler(exp_config=load_config(MULTINODE).areal)._build_env_vars(
        SchedulingSpec(cpu=2, env_vars={})
    )
    for key in ("PYTHONPATH", "TOKENIZERS_PARALLELISM", "MKL_NUM_THREADS"):
        assert env[key] == plain[key], key
