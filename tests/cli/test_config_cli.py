"""train and evaluate read the same config files through the one loader; overrides stand
anywhere; gym options that do not fit the gym's kind are refused at load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cua_native import evaluate, train
from cua_native.config import ConfigError, load_config

ROOT = Path(__file__).parents[2]


def test_overrides_may_stand_anywhere() -> None:
    argv = ["seed=1", "--no-progress", "cua.agent.max_turns=3"]
    assert train.parse_args([*argv, "--steps", "2"]).overrides == [
        "seed=1",
        "cua.agent.max_turns=3",
    ]
    args = evaluate.parse_args(["seed=1", "--episodes", "2", "cua.agent.max_turns=3"])
    assert args.overrides == ["seed=1", "cua.agent.max_turns=3"] and args.episodes == 2
    assert evaluate.build_config(args).cua.agent.max_turns == 3


def test_evaluate_reads_the_training_config() -> None:
    args = evaluate.parse_args(["--config", str(ROOT / "configs" / "default.yaml")])
    assert evaluate.build_config(args).cua.agent.gym.kind == "sim"


def test_sim_options_on_an_http_gym_are_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"\['screenshot_size'\] are not options of a 'http'"):
        load_config(None, ["cua.agent.gym.kind=http", "cua.agent.gym.base_url=http://127.0.0.1:1"])


def test_gym_url_drops_the_configs_simulator_options() -> None:
    args = evaluate.parse_args(["--gym-url", "http://127.0.0.1:1"])
    gym = evaluate.build_config(args).cua.agent.gym
    assert (gym.kind, gym.base_url, gym.options) == ("http", "http://127.0.0.1:1", {})


_MIXED_GYM = """\
cua:
  agent:
    gym:
      kind: sim
      gym_id: phone
      seed: 7
      allowed_media_domains: [media.example.com]
      options:
        screenshot_size: [160, 384]
        timeouts: {create: 5}
        auth_token: secret
"""


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_gym_url_keeps_the_configs_http_gym_settings(command: str, tmp_path: Path) -> None:
    """``--gym-url`` sets kind and address only: what else the config (and the command line)
    says about the gym stays, except options only the simulator takes."""
    config = tmp_path / "gym.yaml"
    config.write_text(_MIXED_GYM)
    module = {"train": train, "evaluate": evaluate}[command]
    argv = [
        "--config",
        str(config),
        "cua.agent.gym.options.retries={attempts: 2}",
        "--gym-url",
        "http://gym.test:8080",
    ]
    gym = module.build_config(module.parse_args(argv)).cua.agent.gym
    assert (gym.kind, gym.base_url) == ("http", "http://gym.test:8080")
    assert (gym.gym_id, gym.seed, gym.allowed_media_domains) == ("phone", 7, ["media.example.com"])
    assert gym.options == {
        "timeouts": {"create": 5},
        "auth_token": "secret",
        "retries": {"attempts": 2},
    }


def test_gym_url_keeps_a_cluster_configs_gym() -> None:
    args = evaluate.parse_args(
        ["--config", str(ROOT / "configs" / "qwen3_vl_android.yaml"), "--gym-url", "http://g:1"]
    )
    gym = evaluate.build_config(args).cua.agent.gym
    assert (gym.kind, gym.base_url, gym.gym_id) == ("http", "http://g:1", "android")
    assert gym.allowed_media_domains == ["tos-cn-beijing.volces.com"]


def test_gym_url_leaves_a_misspelt_option_an_error(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text("cua:\n  agent:\n    gym:\n      options:\n        timeoutz: 3\n")
    args = evaluate.parse_args(["--config", str(config), "--gym-url", "http://127.0.0.1:1"])
    with pytest.raises(ConfigError, match=r"\['timeoutz'\] are not options of a 'http' gym"):
        evaluate.build_config(args)


def test_gym_url_wins_over_kind_overrides() -> None:
    args = train.parse_args(["--gym-url", "http://a:1", "cua.agent.gym.kind=sim"])
    gym = train.build_config(args).cua.agent.gym
    assert (gym.kind, gym.base_url) == ("http", "http://a:1")


def test_yaml_errors_name_the_file_and_the_nearest_key(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("cua:\n  agent: [1,\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        load_config(broken)
    typo = tmp_path / "typo.yaml"
    typo.write_text("cua:\n  agent:\n    max_turnz: 3\n")
    with pytest.raises(ConfigError, match=r"Did you mean 'max_turns'.*typo\.yaml"):
        load_config(typo)


PG_DOWN = "postgresql+psycopg://u:pa55word@127.0.0.1:1/x"
"""Nothing listens on loopback port 1: the connection is refused at once."""


BAD_CONFIGS = [
    ("yaml-list", "- a\n- b\n", None, "the top level must be a mapping of fields (key: value)"),
    ("empty", "", None, "is empty; a config sets its fields"),
    ("comment-only", "# only a comment\n", None, "is empty"),
    ("unknown-db", None, "cua.monitor_db=notaurl://x", "cua.monitor_db: unknown database kind"),
    (
        "db-down",
        None,
        f"cua.monitor_db={PG_DOWN}",
        "cua.monitor_db: cannot connect to the database",
    ),
    ("db-no-dir", None, "cua.monitor_db=sqlite:///no/such/dir/m.db", "does not exist"),
]
CASES = [(command, *case) for command in ("train", "evaluate") for case in BAD_CONFIGS]
CASES.append(
    ("train", "no-optimizer", "cua:\n  mode: embedded\n", None, "actor.optimizer is not set")
)


@pytest.mark.parametrize(
    ("command", "name", "config_text", "override", "message"),
    CASES,
    ids=[f"{case[0]}-{case[1]}" for case in CASES],
)
def test_bad_config_is_one_line_before_anything_is_prepared(
    command: str,
    name: str,
    config_text: str | None,
    override: str | None,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The config is loaded (AReaL imported) but nothing is prepared: no run directory, no
    model, exit 2 with one line that shows no password."""
    argv = ["--run-dir", str(tmp_path / "run"), "--no-progress"]
    if config_text is not None:
        (tmp_path / "bad.yaml").write_text(config_text)
        argv += ["--config", str(tmp_path / "bad.yaml")]
    if override is not None:
        argv.append(override)
    main = {"train": train.main, "evaluate": evaluate.main}[command]
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(lines) == 1 and message in lines[0], lines
    assert "pa55word" not in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / ".cache").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cua.monitor_db=notaurl://x", "cua.monitor_db: unknown database kind 'notaurl'"),
        (f"cua.monitor_db={PG_DOWN}", "cua.monitor_db: cannot connect to the database"),
    ],
)
def test_a_rehearsal_checks_the_database_it_is_told_to_use(
    override: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (
        "TORCHDYNAMO_DISABLE",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
    ):
        monkeypatch.setenv(var, os.environ.get(var, "1"))  # what --rehearse sets, undone after
    config = str(ROOT / "configs" / "qwen3_vl_android.yaml")
    code = train.main(
        ["--config", config, "--rehearse", "--run-dir", str(tmp_path / "r"), override]
    )
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "r").exists()
