"""Fixtures for the slime routes: slime's own code (vendored, ``tests/slime/vendor``, the commit
in ``NOTICE``) importable as ``slime`` and ``slime_plugins``; the tiny Qwen3-VL; the stand-in
SGLang server with a spy on what it built and answered; slime's arguments for both routes.

The vendored files run unchanged. They need nothing this environment lacks (ray, wandb,
aiohttp, requests, transformers are installed), so no import shim is used.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from areal.api.io_struct import ModelRequest, ModelResponse
from fakes.serving import serve_app as serve_on_loopback

from cua_native.engine import InProcessEngine
from cua_native.engine.serve import ServedModel, build_app
from cua_native.rollout.factories import tiny_model_dir

VENDOR = Path(__file__).parent / "vendor"
if str(VENDOR) not in sys.path:
    sys.path.insert(0, str(VENDOR))

WAIT_S = 120.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Call:
    """One ``/generate`` the stand-in answered: the prompt ids it built and its answer."""

    built: list[int]
    response: ModelResponse
    version: int


@dataclass
class Server:
    host: str
    port: int
    served: ServedModel
    calls: list[Call] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextmanager
def serve(app: Any) -> Iterator[tuple[str, int]]:
    """``app`` on a free loopback port, served by uvicorn on a thread."""
    with serve_on_loopback(app, WAIT_S) as address:
        yield address


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture
def sglang(tiny_dir: Path) -> Iterator[Server]:
    """The stand-in SGLang server on the tiny model, recording every answered call."""
    engine = InProcessEngine.from_pretrained(tiny_dir, device="cpu", dtype=torch.float32, seed=0)
    served = ServedModel(engine, str(tiny_dir))
    calls: list[Call] = []
    original = served.generate

    async def spy(req: ModelRequest) -> ModelResponse:
        resp = await original(req)
        calls.append(Call(list(req.input_ids), resp, engine.get_version()))
        return resp

    served.generate = spy  # type: ignore[method-assign]
    try:
        with serve(build_app(served, "sglang")) as (host, port):
            yield Server(host, port, served, calls)
    finally:
        engine.destroy()


def cua_overrides(run_dir: Path) -> list[str]:
    """The embedded default, shortened: two sim tasks, two turns at most, the monitor in
    ``run_dir``."""
    return [
        f"cua.run_dir={run_dir}",
        "cua.monitor_db=sqlite",
        "cua.agent.max_turns=2",
        "cua.tasks.task_ids=[sim-001,sim-002]",
        "cua.tasks.gym_seeds=[0]",
    ]


def slime_args(tiny_dir: Path, server: Server, run_dir: Path, **extra: Any) -> Namespace:
    """The slime arguments the routes read (slime's names and meanings at the pinned commit)."""
    values: dict[str, Any] = {
        "hf_checkpoint": str(tiny_dir),
        "sglang_router_ip": server.host,
        "sglang_router_port": server.port,
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "rollout_temperature": 1.0,
        "rollout_top_p": 1.0,
        "rollout_top_k": -1,
        "rollout_max_response_len": 24,
        "rewards_normalization": False,
        "cua_config": str(ROOT / "configs" / "default.yaml"),
        "cua_overrides": cua_overrides(run_dir),
        # slime's data source
        "rollout_global_dataset": True,
        "prompt_data": None,
        "dump_details": None,
        "rollout_max_prompt_len": None,
        "input_key": "prompt",
        "multimodal_keys": None,
        "label_key": None,
        "metadata_key": "metadata",
        "tool_key": None,
        "apply_chat_template": True,
        "apply_chat_template_kwargs": {},
        "rollout_seed": 42,
        "rollout_shuffle": False,
        "buffer_filter_path": None,
    }
    values.update(extra)
    return Namespace(**values)


@pytest.fixture
def args_for(tiny_dir: Path) -> Any:
    """``args_for(server, run_dir, **extra)``: slime's arguments (see ``slime_args``)."""
    return lambda server, run_dir, **extra: slime_args(tiny_dir, server, run_dir, **extra)


@pytest.fixture
def tasks_file(tmp_path: Path) -> Path:
    """The two tasks as slime prompt data, written by ``python -m cua_native.slime tasks``."""
    from cua_native.slime.__main__ import main

    out = tmp_path / "tasks.jsonl"
    config = str(ROOT / "configs" / "default.yaml")
    assert main(["tasks", "--config", config, "--out", str(out), *cua_overrides(tmp_path)]) == 0
    return out


@pytest.fixture
def serve_app() -> Any:
    """``serve(app)``: a context manager serving ``app`` on a free loopback port."""
    return serve
