"""``python -m cua_native.engine.serve`` as a process: flags, the ready line, and AReaL's
NCCL-style ("xccl") weight update over a real ``torch.distributed`` group (gloo on CPU)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ParamSpec, WeightUpdateMeta
from areal.engine.core.distributed import init_custom_process_group
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.engine.vllm_remote import RemotevLLMEngine

from cua_native.engine.serve.__main__ import main as serve_main

SERVE = [sys.executable, "-m", "cua_native.engine.serve"]
GREEDY = GenerationHyperparameters(max_new_tokens=12, greedy=True, ignore_eos=True)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--backend", "tgi"], "invalid choice: 'tgi'"),
        (["--backend", "sglang", "--device", "cuda:7"], "no such CUDA device"),
        (["--backend", "sglang", "--device", "tpu"], "must be cpu, cuda or cuda:N"),
        (["--backend", "vllm", "--port", "70000"], "must be in 0..65535"),
        (["--backend", "vllm", "--dtype", "int8"], "invalid choice: 'int8'"),
    ],
)
def test_bad_flags_one_line_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    (tmp_path / "config.json").write_text("{}")  # no weights: loading would fail otherwise
    with pytest.raises(SystemExit) as exit_info:
        serve_main(["--model", str(tmp_path), *flags])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("python -m cua_native.engine.serve: error: ")
    assert says in lines[0]


def test_missing_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve_main(["--model", str(tmp_path / "nope"), "--backend", "sglang"])
    assert capsys.readouterr().err.strip().splitlines() == [
        f"python -m cua_native.engine.serve: error: --model {tmp_path / 'nope'}: "
        "not a model directory (no config.json)"
    ]


@contextmanager
def served_process(model: Path, backend: str, log: Path) -> Iterator[str]:
    """Start the CLI on a free port; yield ``host:port`` once it printed its ready line."""
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*SERVE, "--model", str(model), "--backend", backend, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("serving "):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(300), "no ready line"
        ready_lines = [line for line in lines if line.startswith("serving ")]
        assert ready_lines, f"server exited: {log.read_text()[-2000:]}"
        assert ready_lines[0].startswith(f"serving {backend} on http://127.0.0.1:")
        yield ready_lines[0].removeprefix(f"serving {backend} on http://")
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("client_cls", [RemoteSGLangEngine, RemotevLLMEngine])
async def test_xccl_weight_update_through_the_cli_server(
    kit: Any, sk: Any, tiny: Any, tmp_path: Path, client_cls: type
) -> None:
    backend = "sglang" if client_cls is RemoteSGLangEngine else "vllm"
    reference = kit.engine()
    new_weights = sk.perturbed_state(reference, seed=2)
    reference.update_weights_from_state_dict(new_weights).result()
    req = kit.text_request(GREEDY)
    expected = await reference.agenerate(req)
    reference.destroy()
    meta = WeightUpdateMeta(
        type="xccl",
        gen_allocation=ModelAllocation.from_str(f"{backend}:d1", name="rollout"),
        nccl_master_address="127.0.0.1",
        nccl_master_port=_free_port(),
        nccl_group_name=f"update_weight_group_{backend}",
    )
    group = None
    with (
        served_process(tiny.path, backend, tmp_path / "server.log") as addr,
        sk.areal_client(client_cls, addr, checked=True) as client,
    ):
        before = await client.agenerate(req)
        joined = client.init_weights_update_group(meta)
        group = await asyncio.to_thread(
            init_custom_process_group,
            backend="gloo",
            init_method=f"tcp://127.0.0.1:{meta.nccl_master_port}",
            world_size=2,
            rank=0,
            group_name=meta.nccl_group_name,
        )
        await asyncio.wrap_future(joined)
        # named as AReaL's actor names them for this server (SGLang's or vLLM's layout)
        spelled = sk.areal_spelling(tiny.model, backend)
        specs = [
            ParamSpec(
                name=spelled.get(k, k),
                shape=tuple(v.shape),
                dtype=str(v.dtype).removeprefix("torch."),
            )
            for k, v in new_weights.items()
        ]
        started = time.monotonic()
        update = client.update_weights_from_distributed(meta, specs)
        for tensor in new_weights.values():
            await asyncio.to_thread(dist.broadcast, tensor, 0, group)
        await asyncio.wrap_future(update)
        assert time.monotonic() - started < 120
        after = await client.agenerate(req)
    if group is not None:
        dist.destroy_process_group(group)
    assert before.output_tokens != expected.output_tokens
    assert after.output_tokens == expected.output_tokens
    assert after.output_logprobs == pytest.approx(expected.output_logprobs, abs=1e-5)
