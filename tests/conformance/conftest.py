"""The real inference servers' own code on the payloads the project sends.

Payloads come from real episodes: ``CUAAgentWorkflow.arun_episode`` on the embedded simulator,
three turns (one to three screenshots per prompt), with the agent settings of every shipped
cluster config (its family, prompt variant and pixel budget, with three history images) at the
real Qwen3-VL processor budget, and with both families at the tiny model's budget. The engine behind them answers each turn with a valid action in the
family's own format (it only has to keep the episode going); every prompt it receives is the
prompt builder's, and AReaL's backends (the project's and AReaL's stock ones) turn it into the
HTTP payload a server gets. The probes under ``probes/`` then run in the servers' own
environments (``.conformance/<name>``, built by ``scripts/conformance_envs.sh``) and report
what SGLang's ``TokenizerManager`` and vLLM's render/sampler code make of those payloads.

Missing environments skip these tests locally, and fail them where ``CUA_REQUIRE_CONFORMANCE``
is set (``scripts/test.sh`` sets it, so CI never skips them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from areal.api.io_struct import ModelRequest
from fakes.scripted_engine import ScriptedEngine

from cua_native.actions.dialects import get_dialect
from cua_native.actions.models import Click
from cua_native.gym.sim import SimGym
from cua_native.models.tiny import TinySpec, build_tiny_qwen3_vl
from cua_native.rollout.config import AgentConfig, GymConfig, SamplingConfig
from cua_native.rollout.workflow import CUAAgentWorkflow

ROOT = Path(__file__).resolve().parents[2]
ENVS = ROOT / ".conformance"
PROBES = Path(__file__).resolve().parent / "probes"
PROBE_TIMEOUT_S = 1800
"""A probe imports a whole server (tens of seconds on an idle core); generous under load."""

BUDGETS: dict[str, tuple[TinySpec, int]] = {
    # the tiny model's own processor budget and the embedded default's prompt budget
    "tiny": (TinySpec(), 65536),
    # Qwen3-VL-8B-Instruct's processor (shortest_edge 65,536, longest_edge 16,777,216) and the
    # shipped configs' prompt budget: a 1080x2400 screenshot stays whole (2,550 tokens)
    "real": (TinySpec(min_pixels=65536, max_pixels=16777216), 2621440),
}
FAMILIES = ("qwen3_vl", "mai_ui")
CLUSTER_CONFIGS = (
    "mai_ui_android",
    "qwen3_vl_android",
    "qwen3_vl_linux",
    "qwen3_vl_android_vllm",
)


def server_python(name: str) -> Path:
    """The interpreter of conformance environment ``name``; skip (locally) or fail (CI) when
    it is not built."""
    python = ENVS / name / "bin" / "python"
    if not python.exists():
        message = f"conformance environment {name} missing: bash scripts/conformance_envs.sh"
        if os.environ.get("CUA_REQUIRE_CONFORMANCE"):
            pytest.fail(message)
        pytest.skip(message)
    return python


def run_probe(env: str, probe: str, job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run ``probes/<probe>`` in environment ``env`` on ``job``; its JSON answer."""
    python = server_python(env)
    job_path, out_path = tmp / f"{probe}.job.json", tmp / f"{probe}.out.json"
    job_path.write_text(json.dumps(job))
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env_vars.update(
        {"PYTHONPATH": str(PROBES), "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    )
    done = subprocess.run(
        [str(python), str(PROBES / probe), str(job_path), str(out_path)],
        env=env_vars,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0 or not out_path.exists():
        raise AssertionError(
            f"probe {probe} in {env} exited {done.returncode}:\n{done.stderr[-4000:]}"
        )
    answer: dict[str, Any] = json.loads(out_path.read_text())
    return answer


@dataclass
class Turns:
    """The prompts of one episode, as the workflow sent them."""

    label: str
    """The shipped config whose agent settings played it, or the family (tiny budget)."""
    budget: str
    model_dir: Path
    requests: list[ModelRequest] = field(default_factory=list)


def tiny_agent(family: str, model_dir: Path, turns: int) -> AgentConfig:
    return AgentConfig(
        family=family,  # type: ignore[arg-type]
        model_path=str(model_dir),
        prompt={"history_images": turns, "max_pixels": BUDGETS["tiny"][1]},
        sampling=SamplingConfig(max_new_tokens=64, temperature=1.0),
    )


def shipped_agent(name: str, model_dir: Path, turns: int) -> AgentConfig:
    """A shipped cluster config's agent (family, prompt variant, pixel budget, sampling) on the
    simulator, keeping ``turns`` screenshots of history."""
    from cua_native.config import load_config

    agent = load_config(ROOT / "configs" / f"{name}.yaml", [f"actor.path={model_dir}"]).cua.agent
    return agent.model_copy(
        update={"model_path": str(model_dir), "prompt": {**agent.prompt, "history_images": turns}}
    )


def play(label: str, budget: str, model_dir: Path, agent: AgentConfig, turns: int = 3) -> Turns:
    """One episode of ``turns`` turns on the simulator; the requests its engine received."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    family = agent.family
    config = agent.model_copy(
        update={"max_turns": turns, "group_size": 1, "infra_retries": 0, "gym": GymConfig()}
    )

    async def episode() -> list[ModelRequest]:
        gym = SimGym(seed=0)
        engine = ScriptedEngine(
            processor.tokenizer,
            get_dialect(family),
            lambda turn: Click(x=0.5, y=0.4 + 0.1 * turn),  # one episode: its n-th request
            processor.tokenizer.convert_tokens_to_ids("<|im_end|>"),
            thought="Open the next screen.",
            logprob=0.0,
        )
        flow = CUAAgentWorkflow(config, gym=gym, processor=processor)
        try:
            task = (await gym.list_tasks())[0]
            await flow.arun_episode(engine, {"task": task.model_dump_json()})
        finally:
            await flow.aclose()
            await gym.aclose()
        return engine.requests

    return Turns(label, budget, model_dir, asyncio.run(episode()))


@dataclass
class Corpus:
    """Every episode's prompts, by (label, budget)."""

    episodes: dict[tuple[str, str], Turns]

    def all(self) -> Sequence[Turns]:
        return list(self.episodes.values())


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    episodes: dict[tuple[str, str], Turns] = {}
    tiny_dir = build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny-tiny"), BUDGETS["tiny"][0])
    for family in FAMILIES:
        episodes[family, "tiny"] = play(family, "tiny", tiny_dir, tiny_agent(family, tiny_dir, 3))
    real_dir = build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny-real"), BUDGETS["real"][0])
    for name in CLUSTER_CONFIGS:
        episodes[name, "real"] = play(name, "real", real_dir, shipped_agent(name, real_dir, 3))
    return Corpus(episodes)


class ConformanceKit:
    """The helpers above, handed to tests as a fixture (importlib mode cannot import conftest)."""

    run_probe = staticmethod(run_probe)
    server_python = staticmethod(server_python)
    BUDGETS = BUDGETS


@pytest.fixture(scope="session")
def conformance() -> ConformanceKit:
    return ConformanceKit()
