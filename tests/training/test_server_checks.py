"""Load-time checks of the inference-server settings (``training.cluster.server_checks``): the shipped
configs pass; each setting that would make a real server generate from other ids or report other
log-probs gives one line naming its field. The servers' own behaviour behind each rule is run in
``tests/conformance``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cua_native.config import ConfigError, load_config
from cua_native.training.cluster.checks import check_cluster_config
from cua_native.training.cluster.server_checks import SUPPORTED, check_vllm

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
VLLM = CONFIGS / "qwen3_vl_android_vllm.yaml"
SGLANG_CONFIGS = ["qwen3_vl_android.yaml", "mai_ui_android.yaml", "qwen3_vl_linux.yaml"]


def test_the_vllm_config_asks_for_the_sampling_distributions_logprobs() -> None:
    loaded = load_config(VLLM)
    assert loaded.areal.vllm.logprobs_mode == "processed_logprobs"
    check_cluster_config(loaded)


@pytest.mark.parametrize(
    "overrides",
    [
        ["cua.agent.sampling.temperature=0.7"],
        ["cua.agent.sampling.top_p=0.9"],
        ["cua.agent.sampling.top_k=20"],
    ],
)
def test_raw_logprobs_are_refused_when_sampling_changes_the_distribution(
    overrides: list[str],
) -> None:
    loaded = load_config(VLLM, ["vllm.logprobs_mode=raw_logprobs", *overrides])
    with pytest.raises(ConfigError) as err:
        check_cluster_config(loaded)
    message = str(err.value)
    assert message.startswith("config error: vllm.logprobs_mode: must be processed_logprobs")
    assert "\n" not in message


def test_raw_logprobs_pass_at_the_models_own_distribution() -> None:
    # T = 1, no top-p/top-k: raw and processed log-probs are the same numbers
    check_cluster_config(load_config(VLLM, ["vllm.logprobs_mode=raw_logprobs"]))
    greedy = ["vllm.logprobs_mode=raw_logprobs", "cua.agent.sampling.greedy=true"]
    check_cluster_config(load_config(VLLM, greedy))


@pytest.mark.parametrize("mode", ["raw_logits", "processed_logits", "tempered"])
def test_logit_modes_and_unknown_modes_are_refused(mode: str) -> None:
    loaded = load_config(VLLM, [f"vllm.logprobs_mode={mode}"])
    with pytest.raises(ConfigError, match=r"^config error: vllm\.logprobs_mode: must be"):
        check_cluster_config(loaded)


@pytest.mark.parametrize(
    ("version", "refused"), [("0.9.2", True), ("0.10.0", False), ("0.19.1", False)]
)
def test_a_vllm_without_logprobs_mode_is_refused_at_temperature(
    version: str, refused: bool
) -> None:
    loaded = load_config(VLLM, ["cua.agent.sampling.temperature=0.7"])
    if refused:
        with pytest.raises(ConfigError, match=f"^config error: rollout.backend: vLLM {version}"):
            check_vllm(loaded, version)
    else:
        check_vllm(loaded, version)
    check_vllm(load_config(VLLM), "0.9.2")  # T = 1: raw log-probs are right


@pytest.mark.parametrize("name", SGLANG_CONFIGS)
def test_sglang_must_tokenize_with_the_trained_model(name: str) -> None:
    check_cluster_config(load_config(CONFIGS / name))
    loaded = load_config(CONFIGS / name, ["sglang.model_path=/models/another"])
    with pytest.raises(
        ConfigError, match=r"^config error: sglang\.model_path: must be actor\.path"
    ):
        check_cluster_config(loaded)


def test_supported_versions_are_the_conformance_environments() -> None:
    envs = Path(__file__).resolve().parents[1] / "conformance" / "envs"
    locked = {p.stem for p in envs.glob("*.lock")}
    assert locked == {f"{name}-{v}" for name, versions in SUPPORTED.items() for v in versions}
