"""Bad input, tried as a user would: the real commands as subprocesses. Each must print one
clear line, exit non-zero and load nothing (torch, transformers and AReaL never imported)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).parent / "run_cli.py"


def _run(tmp_path: Path, module: str, *args: str) -> tuple[int, list[str], list[str]]:
    out = tmp_path / "imports.json"
    env = {"CLI_IMPORTS_OUT": str(out), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(RUNNER), module, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return proc.returncode, lines, json.loads(out.read_text())


SECRET = "pa55word"
DOWN = "cannot connect to the database postgresql+psycopg://u:***@127.0.0.1:1/x"
"""Port 1 on loopback: nothing listens there, the connection is refused at once."""

CASES = [
    ("cua_native.evaluate", ["--db", "notaurl://x"], "unknown database kind 'notaurl'"),
    ("cua_native.evaluate", ["--db", "sqlite:///no/such/dir/m.db"], "does not exist"),
    ("cua_native.evaluate", ["--monitor", "ftp://example.com/x"], "--monitor"),
    ("cua_native.evaluate", ["--gym-url", "http://127.0.0.1:9"], "cannot reach the gym"),
    ("cua_native.evaluate", ["--model", "/missing"], "not a model directory"),
    ("cua_native.evaluate", ["--tasks", "3-1"], "--tasks: number range '3-1' runs backwards"),
    ("cua_native.evaluate", ["--tasks", "1,sim-002"], "mixes task numbers and task ids"),
    ("cua_native.evaluate", ["--run-dir", "/proc/cua_native_run"], "cannot create"),
    ("cua_native.train", ["--model", "/missing"], "not a model directory"),
    ("cua_native.train", ["--device", "tpu"], "unknown device 'tpu'"),
    ("cua_native.train", ["--steps", "-1"], "--steps must be at least 1"),
    ("cua_native.train", ["--steps", "0"], "--steps must be at least 1"),
    ("cua_native.train", ["--gym-url", "http://127.0.0.1:9"], "cannot reach the gym"),
    ("cua_native.train", ["--gym-url", "ftp://x"], "--gym-url: expected http(s)"),
    ("cua_native.evaluate", ["--db", f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x"], DOWN),
    ("cua_native.gym.server", ["--fault-profile", "flaky"], "neither inline JSON"),
    ("cua_native.gym.server", ["--fault-profile", "{bad"], "inline JSON is not valid JSON"),
    ("cua_native.gym.server", ["--fault-profile", '{"error_share": {"*": 2}}'], "error_share.*"),
    ("cua_native.gym.server", ["--fault-profile", '{"latency": {"fixed_s": -1}}'], "fixed_s"),
    ("cua_native.gym.server", ["--fault-profile", '{"create_hang": {"seconds": NaN}}'], "finite"),
    ("cua_native.monitor", ["serve", "--db", "notaurl://x"], "unknown database kind"),
    ("cua_native.monitor", ["serve", "--db", "sqlite:///no/such/dir/m.db"], "does not exist"),
]


@pytest.mark.parametrize(
    ("module", "args", "message"), CASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in CASES]
)
def test_one_line_nonzero_exit_nothing_loaded(
    tmp_path: Path, module: str, args: list[str], message: str
) -> None:
    code, lines, heavy = _run(tmp_path, module, *args)
    assert code != 0
    assert len(lines) == 1 and message in lines[0], lines
    assert SECRET not in lines[0]
    assert heavy == []


def test_fault_profile_files(tmp_path: Path) -> None:
    """A profile file that is not a mapping, or not valid YAML/JSON: one line, before the
    gym loads."""
    (tmp_path / "list.yaml").write_text("- error_share\n")
    (tmp_path / "torn.yaml").write_text("error_share: {'*': 0.5\n")
    (tmp_path / "torn.json").write_text('{"seed": ')
    for name, message in [
        ("list.yaml", "expected a mapping of fields, got list"),
        ("torn.yaml", "torn.yaml is not valid YAML"),
        ("torn.json", "torn.json is not valid JSON"),
    ]:
        code, lines, heavy = _run(tmp_path, "cua_native.gym.server", "--fault-profile", name)
        assert code == 2 and len(lines) == 1 and message in lines[0], lines
        assert heavy == []


def test_run_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("not a directory")
    code, lines, heavy = _run(tmp_path, "cua_native.evaluate", "--run-dir", "taken")
    assert code != 0 and len(lines) == 1 and "is a file" in lines[0] and heavy == []
    assert (tmp_path / "taken").read_text() == "not a directory"  # nothing lost
