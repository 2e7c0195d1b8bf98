"""The replay CLI: summary, --json lines, expect matching, unreadable lines, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cua_native.replay import main

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CLICK = '<tool_call>\n{"name":"mobile_use","arguments":{"action":"click","coordinate":[500,250]}}\n</tool_call>'


def _write(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "replay.jsonl"
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8"
    )
    return path


def test_json_output_is_one_object_per_line_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path,
        [
            {"dialect": "mai_ui", "text": "<thinking>\nplan\n</thinking>\n" + CLICK},
            {"dialect": "qwen3_vl", "text": ""},
            "this is not json",
        ],
    )
    assert main([str(path), "--json"]) == 1  # the unreadable line
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out[0] == {
        "ok": True,
        "action": {"type": "click", "x": 500 / 999, "y": 250 / 999},
        "thought": "plan",
        "error": None,
    }
    assert out[1]["ok"] is False and out[1]["error"]["kind"] == "format"
    assert out[2]["ok"] is False and out[2]["error"]["kind"] == "unreadable_line"
    assert len(out) == 3


def test_summary_passes_when_expectations_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path,
        [
            {"dialect": "mai_ui", "text": CLICK, "expect": {"type": "click", "x": 0.5, "y": 0.25}},
            {"dialect": "mai_ui", "text": "", "expect": {"error": "format"}},
            {
                "dialect": "qwen2_5_vl",
                "text": CLICK,
                "image_size": [1000, 500],
                "expect": {"type": "click", "x": 0.5, "y": 0.5},
            },
            {
                "dialect": "qwen3_vl",
                "options": {"tool": "computer_use"},
                "text": CLICK,
                "expect": {"type": "click", "x": 0.5, "y": 0.25},
            },
        ],
    )
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "4 lines, 0 problems" in out
    assert "error:format" in out and "qwen2_5_vl" in out


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (
            {"dialect": "mai_ui", "text": CLICK, "expect": {"type": "click", "x": 0.51, "y": 0.25}},
            "mismatch",
        ),
        ({"dialect": "mai_ui", "text": CLICK, "expect": {"error": "tool_arg"}}, "mismatch"),
        ({"dialect": "mai_ui", "text": "", "expect": {"type": "wait"}}, "mismatch"),
        (
            {"dialect": "mai_ui", "text": "", "expect": {"error": "format"}, "image_size": [0, 1]},
            "unreadable",
        ),
        ({"dialect": "nope", "text": CLICK}, "unreadable"),
        ({"dialect": "mai_ui", "text": 3}, "unreadable"),
        ({"dialect": "mai_ui", "text": CLICK, "expect": {"type": "teleport"}}, "unreadable"),
        ({"dialect": "mai_ui", "text": CLICK, "expect": {"error": "oops"}}, "unreadable"),
        ({"dialect": "qwen3_vl", "options": {"tool": "x"}, "text": CLICK}, "unreadable"),
        ("[1, 2]", "unreadable"),
    ],
)
def test_problems_are_listed_with_line_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: object, problem: str
) -> None:
    path = _write(tmp_path, [{"dialect": "mai_ui", "text": CLICK}, row])
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2: {problem}" in out
    assert "2 lines, 1 problems" in out


def test_missing_file_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent.jsonl")]) == 1
    assert "unreadable" in capsys.readouterr().out


def test_all_fixture_files_meet_their_expectations(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in FIXTURES.glob("*.jsonl"))
    assert len(files) >= 3
    assert main(files) == 0, capsys.readouterr().out


def test_module_entry_point_json() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cua_native.replay", "tests/fixtures/agent_formats.jsonl", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    expected = sum(
        1 for line in (FIXTURES / "agent_formats.jsonl").read_text().splitlines() if line.strip()
    )
    assert len(rows) == expected
    assert rows[0]["ok"] and rows[0]["action"]["type"] == "click"
    assert set(rows[0]) == {"ok", "action", "thought", "error"}
