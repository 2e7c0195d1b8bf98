"""Load-time checks of the cluster configs (the cluster path's findings,
docs/contracts.md#the-cluster-path): every
shipped cluster config passes them, and each rule gives one error naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cua_native.config import ConfigError, load_config
from cua_native.training.cluster.checks import (
    check_cluster_config,
    check_pixel_budget,
    packs_sequences,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CLUSTER_CONFIGS = [
    "mai_ui_android.yaml",
    "qwen3_vl_android.yaml",
    "qwen3_vl_linux.yaml",
    "qwen3_vl_android_vllm.yaml",
    "qwen3_vl_android_multinode.yaml",
]


@pytest.mark.parametrize("name", CLUSTER_CONFIGS)
def test_shipped_cluster_configs_pass_the_checks(name: str) -> None:
    loaded = load_config(CONFIGS / name)
    check_cluster_config(loaded)
    raw = yaml.safe_load((CONFIGS / name).read_text())
    # stated in the file, not left to AReaL's defaults
    assert raw["actor"]["weight_update_mode"] == "xccl"
    assert raw["scheduler"]["type"] in ("local", "ray", "slurm")
    assert raw["cua"]["agent"]["prompt"]["max_pixels"] > 0
    assert loaded.areal.rollout.consumer_batch_size == loaded.areal.train_dataset.batch_size
    assert loaded.areal.rollout.experiment_name == loaded.areal.experiment_name
    assert loaded.areal.rollout.trial_name == loaded.areal.trial_name
    assert loaded.areal.actor.use_decoupled_loss


def test_vlm_configs_default_to_sglang() -> None:
    for name in ("mai_ui_android.yaml", "qwen3_vl_android.yaml", "qwen3_vl_linux.yaml"):
        assert load_config(CONFIGS / name).areal.rollout.backend.startswith("sglang:")
    vllm = load_config(CONFIGS / "qwen3_vl_android_vllm.yaml").areal
    assert vllm.rollout.backend.startswith("vllm:")
    assert vllm.vllm.max_model_len == 262144


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("scheduler.type=null", "scheduler.type"),
        ("rollout.consumer_batch_size=1", "rollout.consumer_batch_size"),
        ("rollout.experiment_name=other", "rollout.experiment_name"),
        ("rollout.trial_name=other", "rollout.trial_name"),
        ("actor.use_decoupled_loss=false", "actor.use_decoupled_loss"),
        ("actor.weight_update_mode=nccl", "actor.weight_update_mode"),
        ("rollout.backend=trt:d4", "rollout.backend"),
        ("cua.agent.prompt.max_pixels=null", "cua.agent.prompt.max_pixels"),
    ],
)
def test_each_rule_names_its_field(override: str, field: str) -> None:
    loaded = load_config(CONFIGS / "qwen3_vl_android.yaml", [override])
    with pytest.raises(ConfigError) as info:
        check_cluster_config(loaded)
    message = str(info.value)
    assert message.startswith(f"config error: {field}:"), message
    assert "\n" not in message


def test_vllm_allow_list_must_match_the_gym() -> None:
    loaded = load_config(
        CONFIGS / "qwen3_vl_android_vllm.yaml", ["vllm.allowed_media_domains=[evil.example]"]
    )
    with pytest.raises(ConfigError, match=r"^config error: vllm.allowed_media_domains:"):
        check_cluster_config(loaded)


def test_offpolicy_zero_may_train_without_decoupled_loss() -> None:
    loaded = load_config(
        CONFIGS / "qwen3_vl_android.yaml",
        ["actor.use_decoupled_loss=false", "rollout.max_head_offpolicyness=0"],
    )
    check_cluster_config(loaded)


class _ImageProcessor:
    def __init__(self) -> None:
        self.size = {"shortest_edge": 4096, "longest_edge": 65536}


class _Processor:
    """Shaped like an HF processor: ``processor.image_processor.size``."""

    def __init__(self) -> None:
        self.image_processor = _ImageProcessor()


@pytest.mark.parametrize(("max_pixels", "ok"), [(65536, True), (65537, False), (1024, False)])
def test_max_pixels_must_lie_in_the_processor_budget(max_pixels: int, ok: bool) -> None:
    loaded = load_config(
        CONFIGS / "qwen3_vl_android.yaml", [f"cua.agent.prompt.max_pixels={max_pixels}"]
    )
    if ok:
        check_pixel_budget(loaded, _Processor())
        return
    with pytest.raises(
        ConfigError, match=r"^config error: cua.agent.prompt.max_pixels: .*\[4096, 65536\]"
    ):
        check_pixel_budget(loaded, _Processor())


def test_packing_only_under_varlen_attention() -> None:
    assert packs_sequences("flash_attention_2")
    assert packs_sequences("flash_attention_3")
    assert not packs_sequences("sdpa")
    assert not packs_sequences("eager")
