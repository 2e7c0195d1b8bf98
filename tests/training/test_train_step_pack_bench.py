"""``bench/gpu/train_step_pack.py`` on CPU with the tiny model: AReaL's own FSDP actor, the three
ways on the same rows, log-probs and the first step's gradient norm equal in fp32, each way's
screenshots encoded as its micro-batches dictate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_runs_on_cpu_and_the_ways_agree(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "gpu" / "train_step_pack.py"),
        "--device",
        "cpu",
        "--tiny",
        "--out",
        str(out),
        "--repeat",
        "1",
        "--text",
        "32",
        # a task's group (4 rows: 78, 108, 78, 108 tokens) does not fit: it is cut into runs
        # of consecutive rows that do ([0, 1, 2] and [3]), and the two short runs share a bin
        "--max-tokens-per-mb",
        "300",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "train_step_pack.json").read_text())
    modes = result["modes"]
    assert list(modes) == ["today", "packed", "packed_vision_once"]
    assert result["screenshot_copies"] == 12 and result["distinct_screenshots"] == 6
    assert modes["today"]["micro_batches"] == 8
    # AReaL's own balancer packs by tokens alone; vision once keeps each episode together
    assert modes["packed"]["micro_batches"] < 8
    assert modes["packed_vision_once"]["micro_batches"] == 3
    assert modes["today"]["images_encoded_per_step"] == 12
    assert modes["packed"]["images_encoded_per_step"] == 12
    # [0, 1, 2] and [4, 5, 6] each encode their task's first screen and one second screen;
    # [3, 7] (one episode of each task) all four of its screenshots
    assert modes["packed_vision_once"]["images_encoded_per_step"] == 2 + 2 + 4
    norm = modes["today"]["first_grad_norm"]
    for figures in modes.values():
        assert figures["max_abs_dlogp_vs_today"] <= 1e-5
        assert abs(figures["first_grad_norm"] - norm) <= 1e-5 * max(1.0, abs(norm))
        assert figures["trained_tokens_per_s"] > 0
    assert "way" in done.stdout and "packed_vision_once" in done.stdout
