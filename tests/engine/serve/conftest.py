"""Fixtures for the stand-in server: a forward gate, a server thread, AReaL's clients.

``kit`` and ``tiny`` come from ``tests/engine/conftest.py``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
from areal.api.io_struct import ModelRequest, ModelResponse, WeightUpdateMeta
from areal.utils import name_resolve, names
from areal.utils.name_resolve import NfsNameRecordRepository
from fakes.serving import serve_app
from PIL import Image

from cua_native.engine import InProcessEngine
from cua_native.engine.remote import prepare_remote_engine
from cua_native.engine.serve import ServedModel, build_app
from cua_native.prompts.images import prepare_image, sizing_from_processor
from cua_native.prompts.request import model_request, run_processor

WAIT_S = 60.0


class ForwardGate:
    """Counts the model's forward passes and blocks pass number ``at`` (0 = the first prefill)
    until ``release``. Hooked on the output embedding, which every forward pass runs once."""

    def __init__(self, model: Any, at: int) -> None:
        self.at = at
        self.calls = 0
        self.blocked = threading.Event()
        self._release = threading.Event()
        self._handle = model.get_output_embeddings().register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        index, self.calls = self.calls, self.calls + 1
        if index == self.at:
            self.blocked.set()
            if not self._release.wait(WAIT_S):
                raise RuntimeError("ForwardGate was never released")

    async def wait_blocked(self) -> None:
        if not await asyncio.to_thread(self.blocked.wait, WAIT_S):
            raise TimeoutError("the gated forward pass never started")

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._release.set()
        self._handle.remove()


def abort_spy(engine: InProcessEngine) -> threading.Event:
    """An event set once ``engine.abort_requests`` has been called (the call goes through)."""
    called = threading.Event()
    original = engine.abort_requests

    def spy() -> None:
        original()
        called.set()

    engine.abort_requests = spy  # type: ignore[method-assign]
    return called


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Bounded polling for state another thread changes."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class Serving:
    addr: str
    served: ServedModel

    @property
    def url(self) -> str:
        return f"http://{self.addr}"


@contextmanager
def serving(engine: InProcessEngine, backend: str, name: str = "tiny") -> Iterator[Serving]:
    """The app on a free loopback port, served by uvicorn on a thread."""
    served = ServedModel(engine, name)
    with serve_app(build_app(served, backend), WAIT_S) as (host, port):
        yield Serving(addr=f"{host}:{port}", served=served)


def client_config(backend: str, **overrides: Any) -> InferenceEngineConfig:
    """What ``PPOTrainer`` hands AReaL's remote engine, scaled down for a test."""
    fields: dict[str, Any] = {
        "backend": f"{backend}:d1",
        "experiment_name": "serve-test",
        "trial_name": "trial",
        "max_concurrent_rollouts": 4,
        "consumer_batch_size": 1,
        "setup_timeout": WAIT_S,
        "request_timeout": WAIT_S,
        "request_retries": 1,
        "pause_grace_period": 0.0,
    }
    fields.update(overrides)
    return InferenceEngineConfig(**fields)


@contextmanager
def areal_client(cls: type, addr: str, *, checked: bool = False, **overrides: Any) -> Iterator[Any]:
    """AReaL's ``RemoteSGLangEngine``/``RemotevLLMEngine`` attached to ``addr``; ``checked``:
    with the project's backend installed (``prepare_remote_engine``, as the workflow does)."""
    backend = "sglang" if "SGLang" in cls.__name__ else "vllm"
    client = cls(client_config(backend, **overrides))
    client.initialize(addr=addr)
    if checked:
        prepare_remote_engine(client)
    try:
        yield client
    finally:
        client.destroy()


def prompt_request(
    processor: Any, gconfig: GenerationHyperparameters, text: str = "Open Settings"
) -> ModelRequest:
    """A turn built by the project's prompt pipeline (what the workflow sends any engine):
    exact ids, the processor's tensors in metadata, base64 PNGs and vLLM chat messages."""
    image = prepare_image(screenshot(), sizing_from_processor(processor), encode=True)
    messages = [
        {"role": "system", "content": "You are a phone agent."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image.message_url}},
                {"type": "text", "text": text},
            ],
        },
    ]
    processed = run_processor(processor, messages, [image])
    return model_request(processed, messages, [image], processor, gconfig)


def screenshot() -> Image.Image:
    image = Image.new("RGB", (1080, 2400), (20, 120, 200))
    for x in range(0, 1080, 90):
        image.paste((235, 120, 30), (x, x, x + 40, x + 200))
    return image


def on_wire(req: ModelRequest) -> ModelRequest:
    """What a remote engine gets: ids, base64 images and chat messages, no processor tensors
    (a private copy: AReaL's vLLM backend rewrites the messages in place)."""
    return dataclasses.replace(req, metadata={}, vision_msg_vllm=copy.deepcopy(req.vision_msg_vllm))


def perturbed_state(engine: InProcessEngine, seed: int) -> dict[str, torch.Tensor]:
    """``engine``'s weights plus small seeded noise: a stand-in for a training step."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + torch.randn(tensor.shape, generator=generator) * 0.05
        if tensor.is_floating_point()
        else tensor.clone()
        for name, tensor in engine.model.state_dict().items()
    }


def areal_spelling(model: Any, backend: str) -> dict[str, str]:
    """Own parameter name -> the name AReaL's FSDP actor broadcasts to a ``backend`` server
    (AReaL's own renaming, ``FSDPEngine._get_model_name_parameters``, run on ``model``)."""
    from types import SimpleNamespace

    from areal.api.alloc_mode import ModelAllocation
    from areal.engine.fsdp_engine import FSDPEngine

    meta = WeightUpdateMeta(type="xccl", gen_allocation=ModelAllocation.from_str(f"{backend}:d1"))
    actor = SimpleNamespace(
        model=model,
        is_vision_model=True,
        model_config=SimpleNamespace(model_type=model.config.model_type),
    )
    own = [name for name, _ in model.named_parameters()]
    sent = [name for name, _ in FSDPEngine._get_model_name_parameters(actor, meta)]  # type: ignore[arg-type]
    return dict(zip(own, sent, strict=True))


class GenerateSpy:
    """Records the prompts ``ServedModel.generate`` gets and how each answer ended."""

    def __init__(self, served: ServedModel) -> None:
        self.entered: list[list[int]] = []
        self.answered: list[tuple[str, int]] = []
        original = served.generate

        async def spy(req: ModelRequest) -> ModelResponse:
            self.entered.append(list(req.input_ids))
            resp = await original(req)
            self.answered.append((resp.stop_reason, len(resp.output_tokens)))
            return resp

        served.generate = spy  # type: ignore[method-assign]


class DiskUpdate:
    """A perturbed checkpoint on disk and AReaL's disk update of a client to it, announced the
    way ``FSDPEngine`` announces a saved checkpoint (the name_resolve key the client waits for)."""

    def __init__(self, kit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int):
        self.path = tmp_path / f"weight_update_seed{seed}"
        saver = kit.engine()
        try:
            saver.update_weights_from_state_dict(perturbed_state(saver, seed)).result()
            saver.model.save_pretrained(self.path)
        finally:
            saver.destroy()
        self._repo = NfsNameRecordRepository(str(tmp_path / "name_resolve"))
        monkeypatch.setattr(name_resolve, "wait", self._repo.wait)
        self.meta = WeightUpdateMeta(
            type="disk", path=str(self.path), clear_checkpoint_after_load=False
        )

    async def apply(self, client: Any, version: int) -> None:
        """``client.update_weights_from_disk`` then ``set_version``, as the trainer does."""
        config = client.config
        key = names.update_weights_from_disk(
            config.experiment_name, config.trial_name, client.get_version()
        )
        self._repo.add(key, str(time.time()), replace=True)
        await asyncio.wrap_future(client.update_weights_from_disk(self.meta))
        client.set_version(version)


@pytest.fixture
def disk_update(
    kit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[int], DiskUpdate]:
    return lambda seed: DiskUpdate(kit, tmp_path, monkeypatch, seed)


async def abort_mid_turn(
    engine: InProcessEngine,
    client: Any,
    req: ModelRequest,
    between: Callable[[], Awaitable[None]] | None = None,
    *,
    rollout_pause: bool = True,
) -> ModelResponse:
    """Run ``req`` through AReaL's ``client`` and, after 6 tokens, do what ``PPOTrainer`` does
    around a weight update: ``rollout.pause()`` (when ``rollout_pause``), ``pause_generation``
    (the server aborts the turn), ``between`` (the update), ``continue_generation``,
    ``rollout.resume()``. Without ``rollout_pause`` the client resubmits at once and the
    resubmission waits at the paused server."""
    gate = ForwardGate(engine.model, at=5)
    aborted = abort_spy(engine)
    try:
        task = asyncio.create_task(client.agenerate(on_wire(req)))
        await gate.wait_blocked()
        if rollout_pause:
            client.pause()
        pausing = asyncio.create_task(asyncio.to_thread(client.pause_generation))
        if not await asyncio.to_thread(aborted.wait, WAIT_S):
            raise TimeoutError("pause_generation never aborted")
        gate.release()
        await pausing
        if between is not None:
            await between()
        await asyncio.to_thread(client.continue_generation)
        if rollout_pause:
            client.resume()
        return await task
    finally:
        gate.close()


class ServeKit:
    """The helpers above, handed to tests as a fixture (importlib mode cannot import conftest)."""

    WAIT_S = WAIT_S
    ForwardGate = ForwardGate
    abort_spy = staticmethod(abort_spy)
    wait_until = staticmethod(wait_until)
    serving = staticmethod(serving)
    areal_client = staticmethod(areal_client)
    client_config = staticmethod(client_config)
    prompt_request = staticmethod(prompt_request)
    on_wire = staticmethod(on_wire)
    perturbed_state = staticmethod(perturbed_state)
    areal_spelling = staticmethod(areal_spelling)
    GenerateSpy = GenerateSpy
    abort_mid_turn = staticmethod(abort_mid_turn)


@pytest.fixture(scope="session")
def sk() -> ServeKit:
    return ServeKit()
