"""The stand-in's vLLM API driven by AReaL 1.0.4's own ``RemotevLLMEngine``, and
docs/contracts.md#vllm-chat-abort:
what AReaL's client makes of a vision (chat) turn aborted by a pause, with and without
``restart_chat_on_abort``."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest
from areal.engine.vllm_remote import RemotevLLMEngine, VLLMBackend

from cua_native.engine.vllm_restart import RestartingVLLMBackend, restart_chat_on_abort

GREEDY = GenerationHyperparameters(max_new_tokens=24, greedy=True, ignore_eos=True)
SAMPLED = GenerationHyperparameters(max_new_tokens=16, temperature=1.0, top_p=0.9)


async def test_chat_and_completions_match_the_in_process_engine(
    kit: Any, sk: Any, tiny: Any
) -> None:
    reference, engine = kit.engine(), kit.engine()
    vision = sk.prompt_request(tiny.processor, GREEDY)
    sampled = sk.prompt_request(tiny.processor, SAMPLED, "Go home")
    text = kit.text_request(GREEDY)
    try:
        expected = [await reference.agenerate(r) for r in (vision, sampled, text)]
        with (
            sk.serving(engine, "vllm") as srv,
            sk.areal_client(RemotevLLMEngine, srv.addr) as client,
        ):
            got = [await client.agenerate(sk.on_wire(r)) for r in (vision, sampled, text)]
        for out, ref in zip(got, expected, strict=True):
            assert out.output_tokens == ref.output_tokens
            assert out.output_logprobs == pytest.approx(ref.output_logprobs, abs=1e-5)
            assert out.stop_reason == ref.stop_reason
    finally:
        reference.destroy()
        engine.destroy()


async def test_chat_answer_reports_the_prompt_it_built(kit: Any, sk: Any, tiny: Any) -> None:
    """``usage.prompt_tokens`` and ``prompt_token_ids`` let the client check that the server
    built exactly the prompt builder's ids from the chat messages
    (docs/contracts.md#server-prompt-check)."""
    engine = kit.engine()
    req = sk.prompt_request(tiny.processor, GREEDY)
    payload = VLLMBackend().build_generation_request(sk.on_wire(req), False, 0).payload
    payload["return_token_ids"] = True
    try:
        with sk.serving(engine, "vllm") as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
                body = (await http.post("/v1/chat/completions", json=payload)).json()
                url = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
                remote = copy.deepcopy(payload)
                remote["messages"][1]["content"][0] = url
                refused = await http.post("/v1/chat/completions", json=remote)
                health = await http.get("/health")
        assert body["object"] == "chat.completion"
        assert body["usage"]["prompt_tokens"] == len(req.input_ids)
        assert body["prompt_token_ids"] == req.input_ids
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length"
        assert [int(c["token"].split(":")[1]) for c in choice["logprobs"]["content"]] == choice[
            "token_ids"
        ]
        assert refused.status_code == 400
        assert "inline images only" in refused.json()["error"]["message"]
        assert health.status_code == 200
    finally:
        engine.destroy()


async def _stock_abort(kit: Any, sk: Any, req: ModelRequest) -> tuple[Any, Any, Any]:
    """(uninterrupted answer, server-side spy, AReaL's answer with a pause after 6 tokens)."""
    reference, engine = kit.engine(), kit.engine()
    try:
        full = await reference.agenerate(req)
        with (
            sk.serving(engine, "vllm") as srv,
            sk.areal_client(RemotevLLMEngine, srv.addr) as client,
        ):
            spy = sk.GenerateSpy(srv.served)
            out = await sk.abort_mid_turn(engine, client, req)
        return full, spy, out
    finally:
        reference.destroy()
        engine.destroy()


async def test_text_path_continues_exactly(kit: Any, sk: Any) -> None:
    req = kit.text_request(GREEDY)
    full, spy, out = await _stock_abort(kit, sk, req)
    assert spy.entered == [req.input_ids, req.input_ids + full.output_tokens[:6]]
    assert out.output_tokens == full.output_tokens
    assert out.output_logprobs == pytest.approx(full.output_logprobs, abs=1e-5)


async def test_stock_areal_concatenates_an_aborted_vision_turn(
    kit: Any, sk: Any, tiny: Any
) -> None:
    """The vLLM chat abort (docs/contracts.md#vllm-chat-abort), reproduced with AReaL's own
    client against vLLM's abort semantics: the turn becomes the partial followed by a fresh
    answer to the same messages."""
    req = sk.prompt_request(tiny.processor, GREEDY)
    full, spy, out = await _stock_abort(kit, sk, req)
    assert spy.entered == [req.input_ids, req.input_ids]  # the partial is not sent back
    assert spy.answered == [("abort", 6), ("length", 18)]
    assert out.output_tokens == full.output_tokens[:6] + full.output_tokens[:18]
    assert out.output_tokens != full.output_tokens


async def test_restart_chat_on_abort_restarts_the_turn_under_new_weights(
    kit: Any, sk: Any, tiny: Any, disk_update: Any
) -> None:
    """With ``restart_chat_on_abort`` the aborted partial is dropped and the whole turn is the
    answer of the updated model to the original messages (AReaL's disk update flow)."""
    update = disk_update(3)
    new, engine = kit.engine(), kit.engine()
    new.update_weights_from_disk(update.path).result()
    req = sk.prompt_request(tiny.processor, GREEDY)
    try:
        full_new = await new.agenerate(req)
        with (
            sk.serving(engine, "vllm") as srv,
            sk.areal_client(RemotevLLMEngine, srv.addr) as client,
        ):
            assert restart_chat_on_abort(client)
            assert restart_chat_on_abort(client)  # idempotent
            assert isinstance(client._engine.backend, RestartingVLLMBackend)
            spy = sk.GenerateSpy(srv.served)
            out = await sk.abort_mid_turn(
                engine, client, req, between=lambda: update.apply(client, version=1)
            )
        assert spy.answered == [("abort", 6), ("length", 24)]
        assert out.output_tokens == full_new.output_tokens
        assert out.output_logprobs == pytest.approx(full_new.output_logprobs, abs=1e-5)
        assert out.output_versions == [1] * 24
        assert out.stop_reason == "length"
    finally:
        new.destroy()
        engine.destroy()


def test_restart_chat_on_abort_leaves_other_engines_alone(kit: Any) -> None:
    engine = kit.engine()
    try:
        assert restart_chat_on_abort(engine) is False
    finally:
        engine.destroy()
    completion = {
        "object": "text_completion",
        "choices": [
            {
                "finish_reason": "abort",
                "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5]},
            }
        ],
    }
    parsed = RestartingVLLMBackend().parse_generation_response(completion)
    assert parsed.output_tokens == [7]  # the text path continues exactly: keep its partial
