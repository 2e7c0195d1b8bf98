"""Attached rollout workers ask the servers for the trainer's collective backend (issue 12).

Rollout workers that only attach to running servers hold no GPU, so AReaL's request builder
(which names the backend of the process it runs in) would ask for ``gloo`` while the actor on
GPUs creates an ``nccl`` group; the two-GPU rehearsal hung there. Checked with AReaL's own
request builders (the engines wrap them) and AReaL's Ray scheduler (what a worker starts with).
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from areal.api.alloc_mode import ModelAllocation
from areal.api.io_struct import WeightUpdateMeta
from areal.infra.scheduler.ray import RayScheduler

from cua_native.config import load_config
from cua_native.engine.remote import prepare_remote_engine
from cua_native.training.cluster.attached_engines import (
    WEIGHT_BACKEND_ENV,
    AttachedSGLangEngine,
    AttachedVLLMEngine,
)
from cua_native.training.cluster.trainer import name_weight_backend

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "qwen3_vl_android.yaml"


def _meta(backend: str) -> WeightUpdateMeta:
    return WeightUpdateMeta(
        type="xccl",
        gen_allocation=ModelAllocation.from_str(f"{backend}:d2"),
        nccl_master_address="10.0.0.1",
        nccl_master_port=29500,
        nccl_group_name="update_weight_group",
    )


@pytest.mark.parametrize(
    ("engine_cls", "backend", "endpoint"),
    [
        (AttachedSGLangEngine, "sglang", "/init_weights_update_group"),
        (AttachedVLLMEngine, "vllm", "/areal_init_weights_update_group"),
    ],
)
def test_the_group_request_names_the_trainer_backend(
    engine_cls: type, backend: str, endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loaded = load_config(CONFIG, [f"cua.run_dir={tmp_path}"])
    monkeypatch.setenv(WEIGHT_BACKEND_ENV, "nccl")
    engine = engine_cls(loaded.areal.rollout)
    request = engine._engine.backend.build_init_weights_group_request("h:1", 1, _meta(backend))
    assert request.endpoint == endpoint
    # everything else is AReaL's: rank offset of the second server, world size, group
    assert request.payload["backend"] == "nccl"  # this process has no GPU: AReaL would say gloo
    assert request.payload["rank_offset"] == 2
    assert request.payload["world_size"] == 3
    assert request.payload["group_name"] == "update_weight_group"
    # the workflow's prompt checks (and vLLM's restart of aborted chat turns) stay installed
    assert prepare_remote_engine(engine)
    assert (
        engine._engine.backend.build_init_weights_group_request("h:1", 1, _meta(backend)).payload[
            "backend"
        ]
        == "nccl"
    )


def test_without_the_variable_the_request_is_areals(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from areal.infra.platforms import current_platform

    loaded = load_config(CONFIG, [f"cua.run_dir={tmp_path}"])
    monkeypatch.delenv(WEIGHT_BACKEND_ENV, raising=False)
    engine = AttachedSGLangEngine(loaded.areal.rollout)
    request = engine._engine.backend.build_init_weights_group_request("h:1", 0, _meta("sglang"))
    assert request.payload["backend"] == current_platform.communication_backend


@pytest.mark.parametrize(("actor_gpus", "expected"), [(1, "nccl"), (0, "gloo")])
def test_rollout_workers_are_told_the_actor_backend(
    actor_gpus: int, expected: str, tmp_path: Path
) -> None:
    loaded = load_config(CONFIG, [f"cua.run_dir={tmp_path}"])
    for spec in loaded.areal.actor.scheduling_spec:
        spec.gpu = actor_gpus
    name_weight_backend(loaded.areal)
    ray_like = types.SimpleNamespace(enable_tms_offload=False)
    for spec in loaded.areal.rollout.scheduling_spec:
        assert RayScheduler._build_env_vars(ray_like, spec)[WEIGHT_BACKEND_ENV] == expected


def test_a_backend_the_config_names_wins(tmp_path: Path) -> None:
    loaded = load_config(CONFIG, [f"cua.run_dir={tmp_path}"])
    loaded.areal.rollout.scheduling_spec[0].env_vars = {WEIGHT_BACKEND_ENV: "gloo"}
    name_weight_backend(loaded.areal)
    assert loaded.areal.rollout.scheduling_spec[0].env_vars[WEIGHT_BACKEND_ENV] == "gloo"
