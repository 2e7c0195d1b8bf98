"""The stand-in's SGLang API driven by AReaL 1.0.4's own ``RemoteSGLangEngine``."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters
from areal.engine.sglang_remote import RemoteSGLangEngine

GREEDY = GenerationHyperparameters(max_new_tokens=24, greedy=True, ignore_eos=True)
SAMPLED = GenerationHyperparameters(max_new_tokens=16, temperature=1.0, top_p=0.9)


async def test_generate_matches_the_in_process_engine(kit: Any, sk: Any, tiny: Any) -> None:
    """Greedy and seeded sampling, a processor-built prompt and one from the project's prompt
    pipeline: the server rebuilds the vision inputs from ids + base64 images exactly."""
    reference = kit.engine()
    engine = kit.engine()
    requests = [
        kit.vision_request(GREEDY),
        kit.vision_request(SAMPLED),
        sk.prompt_request(tiny.processor, GREEDY),
    ]
    try:
        expected = [await reference.agenerate(r) for r in requests]
        with (
            sk.serving(engine, "sglang") as srv,
            sk.areal_client(RemoteSGLangEngine, srv.addr) as client,
        ):
            got = [await client.agenerate(sk.on_wire(r)) for r in requests]
        for out, ref in zip(got, expected, strict=True):
            assert out.output_tokens == ref.output_tokens
            assert out.output_logprobs == pytest.approx(ref.output_logprobs, abs=1e-5)
            assert out.input_tokens == ref.input_tokens
            assert out.stop_reason == ref.stop_reason
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
        assert meta["prompt_tokens"] == len(req.input_ids)  # the server prompt check
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
    reference, engine = kit.engine(), kit.engine()
    prompt = kit.vision_request(GREEDY).input_ids
    try:
        full = await reference.agenerate(kit.vision_request(GREEDY))
        with (
            sk.serving(engine, "sglang") as srv,
            sk.areal_client(RemoteSGLangEngine, srv.addr) as client,
        ):
            spy = sk.GenerateSpy(srv.served)

            async def while_paused() -> None:
                await sk.wait_until(lambda: len(spy.entered) == 2, "the client's resubmission")
                assert srv.served.paused
                assert srv.served.inflight == 0  # the resubmission waits at the paused gate
                assert spy.answered == [("abort", 6)]

            out = await sk.abort_mid_turn(
                engine, client, kit.vision_request(GREEDY), while_paused, rollout_pause=False
            )
        assert spy.entered == [prompt, prompt + full.output_tokens[:6]]
        assert spy.answered == [("abort", 6), ("length", 18)]
        assert out.output_tokens == full.output_tokens  # exact continuation
        assert out.output_logprobs == pytest.approx(full.output_logprobs, abs=1e-5)
        assert out.input_tokens == prompt
        assert out.stop_reason == "length"
    finally:
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


async def test_weight_update_from_disk_mid_turn(kit: Any, sk: Any, disk_update: Any) -> None:
    """AReaL's disk update flow (pause, update with abort, continue) while a turn is running:
    the turn keeps the old weights' tokens and continues exactly under the new ones."""
    update = disk_update(1)
    old, new, engine = kit.engine(), kit.engine(), kit.engine()
    new.update_weights_from_disk(update.path).result()
    try:
        before = await old.agenerate(kit.vision_request(GREEDY))
        with (
            sk.serving(engine, "sglang") as srv,
            sk.areal_client(RemoteSGLangEngine, srv.addr) as client,
        ):
            out = await sk.abort_mid_turn(
                engine,
                client,
                kit.vision_request(GREEDY),
                lambda: update.apply(client, version=1),
                rollout_pause=False,
            )
            fresh = await client.agenerate(sk.on_wire(kit.vision_request(GREEDY)))
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
        for e in (old, new, engine):
            e.destroy()
