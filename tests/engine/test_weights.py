"""Weight updates: in memory, from disk, and at step boundaries of in-flight requests."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import WeightUpdateMeta


def _perturbed(model: Any, scale: float = 0.5) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(123)
    return {
        name: t + scale * torch.randn(t.shape, generator=gen)
        for name, t in model.state_dict().items()
        if name.startswith("model.language_model.layers.") and t.is_floating_point()
    }


async def test_state_dict_update_changes_outputs_and_versions(kit: Any) -> None:
    engine = kit.engine()
    try:
        gconfig = GenerationHyperparameters(max_new_tokens=10)
        before = await engine.agenerate(kit.text_request(gconfig, seed=4))
        update = _perturbed(engine.model)
        await asyncio.wrap_future(engine.update_weights_from_state_dict(update, version=3))
        assert engine.get_version() == 3
        req = kit.text_request(gconfig, seed=4)
        after = await engine.agenerate(req)
        assert after.output_versions == [3] * 10
        assert after.output_logprobs != pytest.approx(before.output_logprobs, abs=1e-3)
        new_model = copy.deepcopy(kit.tiny.model)
        new_model.load_state_dict(update, strict=False)
        ref = kit.reference(req, after.output_tokens, 1.0, model=new_model)
        assert torch.allclose(torch.tensor(after.output_logprobs), ref, atol=1e-4, rtol=0)
        engine.set_version(9)
        assert (await engine.agenerate(req)).output_versions == [9] * 10
    finally:
        engine.destroy()


def test_bad_state_dict_is_rejected_untouched(kit: Any) -> None:
    engine = kit.engine()
    try:
        before = {k: v.clone() for k, v in engine.model.state_dict().items()}
        with pytest.raises(ValueError, match="unknown"):
            engine.update_weights_from_state_dict({"nope.weight": torch.zeros(2)})
        name = next(iter(before))
        with pytest.raises(ValueError, match="shape"):
            engine.update_weights_from_state_dict({name: torch.zeros(1, 1, 1)})
        for k, v in engine.model.state_dict().items():
            assert torch.equal(v, before[k])
    finally:
        engine.destroy()


async def test_update_from_saved_directory(kit: Any, tmp_path: Path) -> None:
    engine = kit.engine()
    try:
        trained = copy.deepcopy(kit.tiny.model)
        trained.load_state_dict(_perturbed(trained), strict=False)
        trained.save_pretrained(tmp_path / "ckpt")
        meta = WeightUpdateMeta(type="disk", path=str(tmp_path / "ckpt"), version=2)
        await asyncio.wrap_future(engine.update_weights_from_disk(meta))
        assert engine.get_version() == 2
        for name, tensor in trained.state_dict().items():
            assert torch.equal(engine.model.state_dict()[name], tensor), name
        await asyncio.wrap_future(engine.update_weights_from_disk(tmp_path / "ckpt", version=5))
        assert engine.get_version() == 5
        with pytest.raises(FileNotFoundError):
            await asyncio.wrap_future(engine.update_weights_from_disk(tmp_path / "missing", 6))
        assert engine.get_version() == 5
    finally:
        engine.destroy()


@pytest.mark.parametrize("decoder", ["slots", "legacy"])
async def test_update_waits_for_step_boundary_of_inflight_request(kit: Any, decoder: str) -> None:
    """No forward overlaps the copy; tokens before/after carry old/new versions and logprobs.

    A forward pass runs from the input embedding to the output head (the slots decoder's
    steps do not go through ``model.forward``)."""
    engine = kit.engine(decoder=decoder)
    forwards: list[tuple[float, float]] = []
    started = threading.Event()
    submitted = threading.Event()
    local = threading.local()

    def pre(module: Any, args: Any, kwargs: Any) -> None:
        local.t0 = time.perf_counter()

    def post(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        forwards.append((local.t0, time.perf_counter()))
        if len(forwards) == 6:
            started.set()
            submitted.wait(60)  # the request stays in flight until the update is queued

    copies: list[tuple[str, float]] = []
    original_state_dict = engine.model.state_dict

    def recording_state_dict(*args: Any, **kwargs: Any) -> Any:
        copies.append((threading.current_thread().name, time.perf_counter()))
        return original_state_dict(*args, **kwargs)

    engine.model.state_dict = recording_state_dict  # type: ignore[method-assign]
    engine.model.get_input_embeddings().register_forward_pre_hook(pre, with_kwargs=True)
    engine.model.get_output_embeddings().register_forward_hook(post, with_kwargs=True)
    try:
        gconfig = GenerationHyperparameters(max_new_tokens=40, temperature=1.0)
        req = kit.vision_request(gconfig, seed=8)
        task = asyncio.create_task(engine.agenerate(req))
        await asyncio.to_thread(started.wait, 10)
        update = _perturbed(engine.model)
        copies.clear()
        updated = engine.update_weights_from_state_dict(update, version=1)
        submitted.set()
        await asyncio.wrap_future(updated)
        resp = await task
        in_worker = [t for name, t in copies if name == "inprocess-engine"]
        assert in_worker  # the copy ran on the model's own thread ...
        for t in in_worker:  # ... and outside every forward pass
            assert not any(a <= t <= b for a, b in forwards)
        assert any(b < min(in_worker) for _, b in forwards)  # a request was in flight
        versions = resp.output_versions
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
        split = versions.index(1)
        old_ref = kit.reference(req, resp.output_tokens, 1.0)
        new_model = copy.deepcopy(kit.tiny.model)
        new_model.load_state_dict(update, strict=False)
        new_ref = kit.reference(req, resp.output_tokens, 1.0, model=new_model)
        got = torch.tensor(resp.output_logprobs)
        assert torch.allclose(got[:split], old_ref[:split], atol=1e-4, rtol=0)
        assert torch.allclose(got[split:], new_ref[split:], atol=1e-4, rtol=0)
    finally:
        engine.destroy()


async def test_pause_generation_holds_then_continues(kit: Any) -> None:
    engine = kit.engine()
    try:
        gconfig = GenerationHyperparameters(max_new_tokens=30)
        engine.pause_generation()
        task = asyncio.create_task(engine.agenerate(kit.text_request(gconfig)))
        await asyncio.sleep(0.1)
        assert not task.done()
        await asyncio.wrap_future(
            engine.update_weights_from_state_dict(_perturbed(engine.model), version=4)
        )
        engine.continue_generation()
        resp = await task
        assert resp.output_versions == [4] * 30 and resp.stop_reason == "length"
    finally:
        engine.destroy()


async def test_abort_on_pause(kit: Any) -> None:
    engine = kit.engine(abort_on_pause=True)
    heads = threading.Semaphore(0)
    engine.model.get_output_embeddings().register_forward_hook(lambda *_: heads.release())
    try:
        req = kit.text_request(GenerationHyperparameters(max_new_tokens=100000))
        task = asyncio.create_task(engine.agenerate(req))
        for _ in range(2):  # a second output-head pass: the first token is out
            assert await asyncio.to_thread(heads.acquire, True, 60)
        engine.pause_generation()
        resp = await asyncio.wait_for(task, 120)
        assert resp.stop_reason == "abort" and len(resp.output_tokens) > 0
        engine.continue_generation()
    finally:
        engine.destroy()
