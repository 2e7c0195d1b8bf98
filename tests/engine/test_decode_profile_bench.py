"""``bench/gpu/decode_profile.py``: the CPU smoke run end to end (tiny model, the real engine
and profiler), its step breakdown on a GPU-shaped trace, and its refusal of bad input."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    from bench.gpu import decode_profile

    return decode_profile


def test_cpu_smoke_run_writes_a_breakdown(bench: ModuleType, tmp_path: Path) -> None:
    args = [
        "--device",
        "cpu",
        "--tiny",
        "--out",
        str(tmp_path),
        "--new-tokens",
        "12",
        "--profile-tokens",
        "12",
    ]
    report = bench.main([*args, "--runs", "1", "--modes", "greedy", "--keep-traces"])
    saved = json.loads((tmp_path / "decode_profile.json").read_text())
    assert saved["greedy"]["first_tokens"] == report["greedy"]["first_tokens"]
    greedy = saved["greedy"]
    assert greedy["tok_s"] > 0 and greedy["fraction_of_bound"] is None  # no bound on CPU
    profile = greedy["profile"]
    # the first token is the prefill's; steps 3.. counted; the overlapped loop (the figure)
    # launches one more step after the last token, the step-by-step loop does not
    assert greedy["loop"] == "default" and profile["steps"] == 12 - 3
    assert saved["greedy/unstacked"]["profile"]["steps"] == 12 - 3
    plain = saved["greedy/step_by_step"]
    assert plain["profile"]["steps"] == 12 - 1 - 3
    assert plain["same_tokens_as_first_loop"] and saved["greedy"]["ratio_to"]["step_by_step"] > 0
    assert sum(profile["share_of_step"].values()) == pytest.approx(1.0)
    assert profile["category_us"]["matmul"] > 0 and profile["top_kernels"]
    assert (tmp_path / "trace_greedy.json").exists()


def _event(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args, "tid": 1}


def test_breakdown_of_graph_replays_and_sampling(bench: ModuleType) -> None:
    """Eight 100 us steps: a graph replay (GEMV 40, attention 20, fused norm 10), then the
    sampler's kernel (5) and a synchronising read-back; the rest of each step idle."""
    events: list[dict[str, Any]] = []
    for k in range(8):
        t = 1000.0 + 100 * k
        events += [
            _event("user_annotation", "decode.step", t, 10),
            _event("cuda_runtime", "cudaGraphLaunch", t + 5, 3, correlation=10 * k),
            _event("kernel", "nvjet_hsh_128x64_gemv", t + 10, 40, correlation=10 * k),
            _event("kernel", "flash_fwd_splitkv_kernel", t + 50, 20, correlation=10 * k),
            _event("kernel", "triton_red_fused_add_norm_0", t + 70, 10, correlation=10 * k),
            _event("user_annotation", "decode.sample", t + 12, 75),
            _event("cuda_runtime", "cudaLaunchKernel", t + 13, 2, correlation=10 * k + 1),
            _event("kernel", "log_softmax_forward", t + 80, 5, correlation=10 * k + 1),
            _event("cuda_runtime", "cudaStreamSynchronize", t + 20, 66),
        ]
    parts = bench.breakdown({"traceEvents": events}, top=10)
    assert parts["steps"] == 5
    assert parts["step_us"] == pytest.approx(100)
    assert parts["category_us"]["matmul"] == pytest.approx(40)
    assert parts["category_us"]["attention"] == pytest.approx(20)
    assert parts["category_us"]["norm_rope_elementwise"] == pytest.approx(10)
    assert parts["category_us"]["sampling"] == pytest.approx(5)
    assert parts["idle_us"] == pytest.approx(25)
    assert parts["share_of_step"]["idle_launch_gaps"] == pytest.approx(0.25)
    host = parts["host"]
    assert host["sync_calls_us"] == pytest.approx(66)
    assert host["graph_launches_per_step"] == pytest.approx(1)
    assert host["step_call_us"] == pytest.approx(10) and host["sample_call_us"] == pytest.approx(75)
    assert parts["top_kernels"][0]["name"] == "nvjet_hsh_128x64_gemv"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "beam"], "unknown mode"),
        (["--new-tokens", "4"], "--new-tokens and --profile-tokens must be >= 8"),
    ],
)
def test_bad_input_is_refused_before_any_model(
    bench: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--device", "cpu", "--tiny", "--out", str(tmp_path), *argv])
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err
