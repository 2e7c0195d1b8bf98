"""The training config: defaults, shipped configs, one clear error per wrong field."""

from __future__ import annotations

from pathlib import Path

import pytest
from areal.api.cli_args import vLLMConfig

from cua_native.config import ConfigError, default_config_path, load_config
from cua_native.train import build_config, parse_args

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_no_arguments_loads_the_shipped_default() -> None:
    assert default_config_path().name == "default.yaml"
    loaded = load_config()
    assert loaded.cua.mode == "embedded"
    assert loaded.cua.agent.gym.kind == "sim"
    assert loaded.areal.gconfig.n_samples == 1
    assert loaded.areal.actor.reward_norm is None
    assert loaded.areal.total_train_steps and loaded.areal.total_train_steps > 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path: Path) -> None:
    loaded = load_config(path)
    assert loaded.cua.agent.family in {"mai_ui", "qwen3_vl"}
    if loaded.cua.mode == "areal":
        assert loaded.cua.agent.gym.kind == "http"
        assert loaded.cua.agent.gym.allowed_media_domains  # copied to vLLM by the cluster plan
        if loaded.areal.rollout.backend.startswith("vllm"):
            assert loaded.areal.vllm.max_model_len == 262144
        else:
            assert loaded.areal.sglang.context_length == 262144


def test_shipped_configs_cover_the_families_and_tools() -> None:
    names = {p.name for p in CONFIGS}
    assert {
        "default.yaml",
        "mai_ui_android.yaml",
        "qwen3_vl_android.yaml",
        "qwen3_vl_linux.yaml",
    } <= names
    linux = load_config(Path(CONFIGS[0]).parent / "qwen3_vl_linux.yaml")
    assert linux.cua.agent.dialect.get("tool") == "computer_use"
    assert linux.cua.agent.prompt.get("variant") == "computer_use"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("cua.agent.family=foo", "cua.agent.family: Input should be 'mai_ui' or 'qwen3_vl'"),
        ("cua.agent.max_turnz=3", "Did you mean 'max_turns'?"),
        ("cua.modee=x", "Did you mean 'mode'?"),
        ("actor.eps_clipp=0.1", "Did you mean 'eps_clip'?"),
        ("total_train_steps=abc", "total_train_steps"),
        ("gconfig.n_samples=4", "gconfig.n_samples must be 1"),
        ("cua.agent.gym.kind=ftp", "Input should be 'sim', 'http', 'adb' or 'desktop'"),
        ("cua.mode=areal", "needs a gym server"),
        ("cua.agent.gym.kind=adb", "cua.agent.gym: Value error, kind 'adb' needs base_url"),
        ("cua.agent.sampling.temperature=-1", "cua.agent.sampling.temperature"),
        ("actor.temperature=0.9", "derived from cua.agent.sampling.temperature"),
        ("gconfig.max_new_tokens=9", "derived from cua.agent.sampling.max_new_tokens"),
        ("evaluator.freq_steps=3", "evaluator.freq_steps is derived from cua.eval_every"),
        ("cua.checkpoint_every=3", "It moved to saver.freq_steps"),
    ],
)
def test_a_wrong_field_gives_one_error_naming_it(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(overrides=[override])
    message = str(error.value)
    assert expected in message
    assert "\n" not in message


def test_reward_norm_conflicts_with_in_workflow_normalisation(tmp_path: Path) -> None:
    config = tmp_path / "norm.yaml"
    config.write_text("actor:\n  reward_norm:\n    mean_level: group\n    std_level: group\n")
    with pytest.raises(ConfigError, match=r"actor\.reward_norm must be null"):
        load_config(config)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cua: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_vllm_command_carries_the_cua_server_settings() -> None:
    from cua_native.training.cluster.run import prepare_areal_config

    loaded = load_config(CONFIGS[0].parent / "qwen3_vl_android_vllm.yaml")
    prepare_areal_config(loaded, [])  # copies the gym's allow-list to vLLM
    cmd = vLLMConfig.build_cmd(loaded.areal.vllm, tp_size=1, pp_size=1)
    joined = " ".join(cmd)
    assert "--max-model-len 262144" in joined
    assert '--limit-mm-per-prompt {"image": 64}' in joined
    assert "--allowed-media-domains tos-cn-beijing.volces.com" in joined


def test_cli_flags_become_overrides(tmp_path: Path) -> None:
    args = parse_args(
        ["--steps", "7", "--run-dir", str(tmp_path), "--no-warm-start", "cua.agent.group_size=3"]
    )
    loaded = build_config(args)
    assert loaded.areal.total_train_steps == 7
    assert loaded.cua.run_dir == tmp_path
    assert not loaded.cua.warm_start.enabled
    assert loaded.cua.agent.group_size == 3
    with pytest.raises(ConfigError, match="key=value"):
        build_config(parse_args(["notanoverride"]))


def test_an_error_names_the_file_that_set_the_field(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text("cua:\n  agent:\n    max_turnz: 3\n")
    with pytest.raises(ConfigError) as error:
        load_config(config)
    message = str(error.value)
    assert "cua.agent.max_turnz" in message and "Did you mean 'max_turns'?" in message
    assert f"(set in {config})" in message
    with pytest.raises(ConfigError, match=r"\(set in the command line\)"):
        load_config(config, ["cua.agent.max_turnz=4"])


def test_an_explicit_null_is_kept() -> None:
    """``monitor_db: null`` means no store (it used to fall back to the ``sqlite`` default)."""
    assert load_config(CONFIGS[0].parent / "mai_ui_android.yaml").cua.monitor_db is None
    assert load_config(overrides=["cua.monitor_db=null"]).cua.monitor_db_url() is None
    assert load_config().cua.monitor_db == "sqlite"


@pytest.mark.parametrize(("temperature", "trained"), [(0.6, 0.6), (0.0, 1.0)])
def test_sampling_is_the_one_place_temperatures_come_from(
    temperature: float, trained: float
) -> None:
    loaded = load_config(
        overrides=[f"cua.agent.sampling.temperature={temperature}", "cua.agent.sampling.top_k=7"]
    )
    assert loaded.areal.actor.temperature == trained
    for gconfig in (loaded.areal.gconfig, loaded.areal.eval_gconfig):
        assert gconfig is not None
        assert (gconfig.temperature, gconfig.top_k) == (temperature, 7)
        assert gconfig.max_new_tokens == loaded.cua.agent.sampling.max_new_tokens


def test_evaluations_may_sample_at_their_own_temperature() -> None:
    """Training samples (and PPO's ratio is taken) at the agent's temperature; the baseline and
    every evaluation, embedded or through AReaL's evaluator, at ``cua.eval_temperature``."""
    loaded = load_config(
        overrides=["cua.agent.sampling.temperature=1.0", "cua.eval_temperature=0.7"]
    )
    assert loaded.areal.actor.temperature == 1.0
    assert loaded.areal.gconfig.temperature == 1.0
    assert loaded.areal.eval_gconfig is not None and loaded.areal.eval_gconfig.temperature == 0.7
    evaluated = loaded.cua.eval_agent()
    assert evaluated.sampling.temperature == 0.7
    assert evaluated.sampling.max_new_tokens == loaded.cua.agent.sampling.max_new_tokens
    assert evaluated.group_size == loaded.cua.eval_episodes_per_task
    unset = load_config(overrides=["cua.agent.sampling.temperature=0.9"])
    assert unset.cua.eval_agent().sampling.temperature == 0.9
    assert unset.areal.eval_gconfig is not None and unset.areal.eval_gconfig.temperature == 0.9


@pytest.mark.parametrize(
    ("config", "overrides", "freq_steps"),
    [
        ("default.yaml", [], 24),
        ("default.yaml", ["cua.eval_every=3"], 3),
        ("default.yaml", ["cua.eval_every=0"], None),
        ("default.yaml", ["cua.eval_tasks=null"], None),
        ("qwen3_vl_android.yaml", [], 20),
        ("qwen3_vl_android.yaml", ["cua.eval_every=5"], 5),
    ],
)
def test_eval_every_is_the_one_evaluation_frequency(
    config: str, overrides: list[str], freq_steps: int | None
) -> None:
    """AReaL's evaluator (the cluster path) runs on the frequency the embedded trainer reads."""
    loaded = load_config(CONFIGS[0].parent / config, overrides)
    assert loaded.areal.evaluator.freq_steps == freq_steps
