"""``python -m cua_native.evaluate``: a real run on the SimGym with the tiny model, and the
one-line errors for bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cua_native.evaluate import main


def test_runs_default_gym_and_prints_json_summary(tiny_dir: Path, tmp_path: Path, capsys) -> None:
    code = main(
        [
            "--model",
            str(tiny_dir),
            "--tasks",
            "1",
            "cua.eval_tasks.gym_seeds=[1000]",
            "--episodes",
            "3",
            "--concurrency",
            "2",
            "--run-dir",
            str(tmp_path),
            "--json",
            "--no-progress",
            "--seed",
            "1",
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert code == 0
    assert summary["episodes"] == 3
    assert summary["completed"] + summary["rejected"] == 3
    assert summary["leaked_executions"] == 0
    assert set(summary["parse_errors"]) >= {"format", "tool_name", "tool_arg"}
    assert {"success_rate", "turns_mean", "token_mismatches", "false_done"} <= set(summary)
    assert 0 <= summary["false_done"] <= summary["completed"]
    assert list(summary["outcomes"]) == ["sim-001"]
    assert len(summary["outcomes"]["sim-001"]) == summary["completed"]
    assert summary["model"] == str(tiny_dir)
    assert any(line.startswith("TOTAL") for line in out)
    assert (tmp_path / "monitor.db").is_file(), "recorded where the config says (cua.monitor_db)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--episodes", "0"], "--episodes must be >= 1"),
        (["--gym-id", "x"], "--gym-id needs --gym-url"),
        (["--config", "/nonexistent.yaml"], "no such file"),
        (["--model", "/nonexistent"], "not a model directory"),
    ],
)
def test_bad_options_give_one_line_errors(argv, message, tmp_path: Path, capsys) -> None:
    code = main([*argv, "--run-dir", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert len(err) == 1 and message in err[0]


def test_bad_config_field(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("max_turns: -1\n")
    assert main(["--config", str(config), "--no-progress"]) == 2
    assert "max_turns" in capsys.readouterr().err


def test_reads_the_training_config_through_the_one_loader(
    tiny_dir: Path, tmp_path: Path, capsys
) -> None:
    """``configs/default.yaml`` (the training config) is what evaluate reads; its ``cua.agent``
    runs the episodes, and overrides reach it like ``train``'s."""
    default = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
    argv = ["--config", str(default), "--model", str(tiny_dir), "--run-dir", str(tmp_path)]
    flags = ["--tasks", "2", "--episodes", "1", "--json", "--no-progress"]
    flags.append("cua.eval_tasks.gym_seeds=[1000]")
    code = main([*argv, *flags, "cua.agent.max_turns=1", "cua.monitor_db=null"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["episodes"] == 1 and summary["leaked_executions"] == 0
    assert summary["turns_mean"] <= 1
    assert not (tmp_path / "monitor.db").exists()
    assert main([*argv, *flags, "cua.agent.max_turnz=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Did you mean 'max_turns'?" in err[0]
