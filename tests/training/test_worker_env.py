"""The CUA worker environment reaches Ray and Slurm workers through AReaL's scheduling specs
(docs/contracts.md#worker-environment), checked with AReaL's own Ray scheduler code that
turns a spec into a worker's environment."""

from __future__ import annotations

import types
from pathlib import Path

from areal.infra.scheduler.ray import RayScheduler

from cua_native.config import load_config
from cua_native.monitor.client.lifecycle import RUN_NAME_ENV
from cua_native.training.cluster.run import apply_worker_env, worker_env

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "qwen3_vl_android.yaml"


def test_scheduling_specs_carry_the_worker_env(tmp_path: Path) -> None:
    loaded = load_config(CONFIG, [f"cua.run_dir={tmp_path / 'run'}", "cua.monitor_db=sqlite"])
    env = worker_env(loaded)
    assert env["CUA_MONITOR_DB"].startswith("sqlite:///")
    assert env[RUN_NAME_ENV] == "run"
    assert env["CUA_MONITOR_URL"] == "http://monitor.internal:3000"
    apply_worker_env(loaded, env)
    specs = [*loaded.areal.actor.scheduling_spec, *loaded.areal.rollout.scheduling_spec]
    assert specs
    ray_like = types.SimpleNamespace(enable_tms_offload=False)
    for spec in specs:
        for key, value in env.items():
            assert spec.env_vars[key] == value
        built = RayScheduler._build_env_vars(ray_like, spec)  # what a Ray worker starts with
        assert built["CUA_MONITOR_DB"] == env["CUA_MONITOR_DB"]
        assert built[RUN_NAME_ENV] == "run"


def test_a_value_the_config_sets_wins(tmp_path: Path) -> None:
    loaded = load_config(CONFIG, [f"cua.run_dir={tmp_path / 'run'}"])
    loaded.areal.rollout.scheduling_spec[0].env_vars = {"MALLOC_ARENA_MAX": "4"}
    apply_worker_env(loaded, worker_env(loaded))
    assert loaded.areal.rollout.scheduling_spec[0].env_vars["MALLOC_ARENA_MAX"] == "4"
