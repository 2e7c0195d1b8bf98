"""The stand-in's SGLang API driven by AReaL 1.0.4's own ``RemoteSGLangEngine``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest, WeightUpdateMeta
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.utils import name_resolve, names
from areal.utils.name_resolve import NfsNameRecordRepository

GREEDY = GenerationHyperparameters(max_new_tokens=24, greedy=True, ignore_eos=True)
SAMPLED = GenerationHyperparameters(max_new_tokens=16, temperature=1.0, top_p=0.9)


def _on_wire(req: ModelRequest) -> ModelRequest:
    """What a remote engine gets: ids and base64 images, not the processor's tensors."""
    return dataclasses.replace(req, metadata={})


class GenerateSpy:
    """Records what ``ServedModel.generate`` is called with and answers."""

    def __init__(self, served: Any) -> None:
        self.entered: list[list[int]] = []
        self.answered: list[tuple[str, int]] = []
        original = served.generate

        async def spy(req: ModelRequest) -> Any:
            self.entered.append(list(req.input_ids))
            resp = await original(req)
            self.answered.append((resp.stop_reason, len(resp.output_tokens)))
            return resp

        served.generate = spy


async def test_generate_matches_the_in_process_engine(kit: Any, sk: Any) -> None:
    reference = kit.engine()
    engine = kit.engine()
    try:
        greedy_ref = await reference.agenerate(kit.vision_request(GREEDY))
        sampled_ref = await reference.agenerate(kit.vision_request(SAMPLED))
        with (
            sk.serving(engine, "sglang") as srv,
            sk.areal_client(RemoteSGLangEngine, srv.addr) as client,
        ):
            greedy = await client.agenerate(_on_wire(kit.vision_request(GREEDY)))
            sampled = await client.agenerate(_on_wire(kit.vision_request(SAMPLED)))
        for got, ref in ((greedy, greedy_ref), (sampled, sampled_ref)):
            assert got.output_tokens == ref.output_tokens
            assert got.output_logprobs == pytest.approx(ref.output_logprobs, abs=1e-5)
            assert got.input_tokens == ref.input_tokens
            assert got.stop_reason == ref.stop_reason
    finally:
        reference.destroy()
        engine.destroy()


async def test_generate_answer_has_sglang_shape(kit: Any, sk: Any) -> None:
    engine = kit.engine()
    req = kit.vision_request(GenerationHyperparameters(max_new_tokens=4, greedy=True))
    payload = {
        "input_ids": req.input_ids,
        "image_data": [f"data:image/png;base64,{req.image_data[0]}"],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True,
        "stream": False,
    }
    pad = engine.model.config.image_token_id
    one_pad_short = list(req.input_ids)
    one_pad_short.remove(pad)
    try:
        with sk.serving(engine, "sglang") as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
                body = (await http.post("/generate", json=payload)).json()
                bad = await http.post("/generate", json={**payload, "input_ids": one_pad_short})
                health = await http.get("/health")
                flush = await http.post("/flush_cache")
        meta = body["meta_info"]
        assert meta["prompt_tokens"] == len(req.input_ids)  # finding 11: prompt ids checkable
        assert meta["completion_tokens"] == 4
        assert meta["finish_reason"] == {"type": "length", "length": 4}
        assert [t for _, t, _ in meta["output_token_logprobs"]] == body["output_ids"]
        assert bad.status_code == 400
        assert "placeholder" in bad.json()["error"]["message"]
        assert health.status_code == 200
        assert flush.status_code == 200
    finally:
        engine.destroy()


async def test_pause_aborts_in_flight_and_the_resubmission_completes(kit: Any, sk: Any) -> None:
    reference = kit.engine()
    engine = kit.engine()
    gate = sk.ForwardGate(engine.model, at=5)
    aborted = sk.abort_spy(engine)
    try:
        full = await reference.agenerate(kit.vision_request(GREEDY))
        with (
            sk.serving(engine, "sglang") as srv,
            sk.areal_client(RemoteSGLangEngine, srv.addr) as client,
        ):
            spy = GenerateSpy(srv.served)
            task = asyncio.create_task(client.agenerate(_on_wire(kit.vision_request(GREEDY))))
            await gate.wait_blocked()
            pausing = asyncio.create_task(asyncio.to_thread(client.pause_generation))
            await asyncio.to_thread(aborted.wait, sk.WAIT_S)
            gate.release()
            await pausing  # returns once nothing is in flight
            await sk.wait_until(lambda: len(spy.entered) == 2, "the client's resubmission")
            assert srv.served.inflight == 0  # the resubmission waits at the paused gate
            assert spy.answered == [("abort", 6)]
            await asyncio.to_thread(client.continue_generation)
            out = await task
        prompt = kit.vision_request(GREEDY).input_ids
        assert spy.entered == [prompt, prompt + full.output_tokens[:6]]
        assert spy.answered == [("abort", 6), ("length", 18)]
        assert out.output_tokens == full.output_tokens  # exact continuation
        assert out.output_logprobs == pytest.approx(full.output_logprobs, abs=1e-5)
        assert out.input_tokens == prompt
        assert out.stop_reason == "length"
    finally:
        gate.close()
        reference.destroy()
        engine.destroy()


async def test_queued_requests_abort_before_prefill(kit: Any, sk: Any) -> None:
    engine = kit.engine(max_batch_size=1)
    gate = sk.ForwardGate(engine.model, at=2)
    aborted = sk.abort_spy(engine)
    payload = {
        "input_ids": kit.text_request(GREEDY).input_ids,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 24, "ignore_eos": True, "temperature": 0},
    }
    try:
        with sk.serving(engine, "sglang") as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
                running = asyncio.create_task(http.post("/generate", json=payload))
                await gate.wait_blocked()
                queued = asyncio.create_task(http.post("/generate", json=payload))
                await sk.wait_until(lambda: srv.served.inflight == 2, "the second request")
                pausing = asyncio.create_task(http.post("/pause_generation", json={}))
                await asyncio.to_thread(aborted.wait, sk.WAIT_S)
                gate.release()
                assert (await pausing).status_code == 200
                first, second = (await running).json(), (await queued).json()
                late = asyncio.create_task(http.post("/generate", json=payload))
                await http.post("/continue_generation", json={})
                third = (await late).json()
        assert first["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(first["meta_info"]["output_token_logprobs"]) == 3
        assert second["meta_info"]["finish_reason"] == {
            "type": "abort",
            "message": "Abort before prefill",
        }
        assert second["meta_info"]["prompt_tokens"] == 0
        assert third["meta_info"]["finish_reason"]["type"] == "length"
    finally:
        gate.close()
        engine.destroy()


def _perturbed_checkpoint(kit: Any, path: Path) -> Path:
    model = kit.engine().model  # a private copy
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    model.save_pretrained(path)
    return path


async def test_weight_update_from_disk_mid_turn(
    kit: Any, sk: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AReaL's disk update flow (pause, update with abort, continue) while a turn is running:
    the turn keeps the old weights' tokens and continues exactly under the new ones."""
    checkpoint = _perturbed_checkpoint(kit, tmp_path / "weight_update_v1")
    repo = NfsNameRecordRepository(str(tmp_path / "name_resolve"))
    monkeypatch.setattr(name_resolve, "wait", repo.wait)
    old, new, engine = kit.engine(), kit.engine(), kit.engine()
    new.update_weights_from_disk(checkpoint).result()
    gate = sk.ForwardGate(engine.model, at=5)
    aborted = sk.abort_spy(engine)
    meta = WeightUpdateMeta(type="disk", path=str(checkpoint), clear_checkpoint_after_load=False)
    try:
        before = await old.agenerate(kit.vision_request(GREEDY))
        with (
            sk.serving(engine, "sglang") as srv,
            sk.areal_client(RemoteSGLangEngine, srv.addr) as client,
        ):
            task = asyncio.create_task(client.agenerate(_on_wire(kit.vision_request(GREEDY))))
            await gate.wait_blocked()
            pausing = asyncio.create_task(asyncio.to_thread(client.pause_generation))
            await asyncio.to_thread(aborted.wait, sk.WAIT_S)
            gate.release()
            await pausing
            # What FSDPEngine does on rank 0: announce the saved checkpoint, update, continue.
            key = names.update_weights_from_disk("serve-test", "trial", client.get_version())
            repo.add(key, str(time.time()), replace=True)
            await asyncio.wrap_future(client.update_weights_from_disk(meta))
            client.set_version(1)
            await asyncio.to_thread(client.continue_generation)
            out = await task
            fresh = await client.agenerate(_on_wire(kit.vision_request(GREEDY)))
        head = before.output_tokens[:6]
        resumed = kit.vision_request(dataclasses.replace(GREEDY, max_new_tokens=18))
        resumed.input_ids = resumed.input_ids + head
        tail = await new.agenerate(resumed)
        assert out.output_tokens == head + tail.output_tokens
        assert out.output_logprobs == pytest.approx(
            before.output_logprobs[:6] + tail.output_logprobs, abs=1e-5
        )
        assert out.output_versions == [0] * 6 + [1] * 18
        after = await new.agenerate(kit.vision_request(GREEDY))
        assert fresh.output_tokens == after.output_tokens != before.output_tokens
    finally:
        gate.close()
        for e in (old, new, engine):
            e.destroy()
