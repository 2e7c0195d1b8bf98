"""Sampling controls, stop handling, input paths and clear errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.io_struct import ModelRequest

from cua_native.engine import InProcessEngine, SamplingParams, sample_token


async def test_greedy_is_argmax_of_plain_forward(kit: Any, engine: InProcessEngine) -> None:
    for build in (kit.vision_request, kit.text_request):
        req = build(GenerationHyperparameters(max_new_tokens=16, greedy=True))
        resp = await engine.agenerate(req)
        ids = torch.tensor([req.input_ids + resp.output_tokens])
        mm = req.metadata.get("multi_modal_input") or {}
        kwargs: dict[str, Any] = {}
        if mm:
            types = (ids == kit.tiny.model.config.image_token_id).long()
            kwargs = {**mm, "mm_token_type_ids": types}
        with torch.no_grad():
            kit.tiny.model.model.rope_deltas = None
            logits = kit.tiny.model(input_ids=ids, **kwargs).logits[0]
        n = len(req.input_ids)
        expected = logits[n - 1 : n - 1 + len(resp.output_tokens)].argmax(-1).tolist()
        assert resp.output_tokens == expected
        assert resp.stop_reason == "length"


async def test_stop_token_ids_stop_and_are_included(kit: Any, engine: InProcessEngine) -> None:
    gconfig = GenerationHyperparameters(max_new_tokens=32, temperature=1.0)
    first = await engine.agenerate(kit.text_request(gconfig, seed=11))
    stop_at = first.output_tokens[5]
    cut = first.output_tokens.index(stop_at)
    stopped = await engine.agenerate(
        kit.text_request(gconfig.new(stop_token_ids=[stop_at]), seed=11)
    )
    assert stopped.stop_reason == "stop"
    assert stopped.output_tokens == first.output_tokens[: cut + 1]
    assert stopped.output_logprobs == pytest.approx(first.output_logprobs[: cut + 1], abs=1e-6)


async def test_eos_stops_unless_ignored(kit: Any, engine: InProcessEngine) -> None:
    eos = kit.tiny.tokenizer.eos_token_id

    def favour_eos(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[..., eos] += 100.0
        return output

    engine.model.lm_head.register_forward_hook(favour_eos)
    req = kit.text_request(GenerationHyperparameters(max_new_tokens=8, greedy=True))
    resp = await engine.agenerate(req)
    assert resp.output_tokens == [eos] and resp.stop_reason == "stop"
    assert resp.end_with_stop
    ignored = await engine.agenerate(
        kit.text_request(GenerationHyperparameters(max_new_tokens=4, greedy=True, ignore_eos=True))
    )
    assert ignored.stop_reason == "length" and len(ignored.output_tokens) == 4
    held = await engine.agenerate(
        kit.text_request(GenerationHyperparameters(max_new_tokens=8, greedy=True, min_new_tokens=3))
    )
    assert eos not in held.output_tokens[:3] and held.output_tokens[3] == eos


async def test_max_new_tokens_and_max_tokens_give_length(kit: Any, engine: InProcessEngine) -> None:
    req = kit.vision_request(GenerationHyperparameters(max_new_tokens=5))
    resp = await engine.agenerate(req)
    assert resp.stop_reason == "length" and len(resp.output_tokens) == 5
    assert resp.output_versions == [0] * 5
    assert resp.tokenizer is req.tokenizer and resp.processor is req.processor
    assert 0 < resp.ttft <= resp.latency and len(resp.itl) == 4
    capped = kit.text_request(GenerationHyperparameters(max_new_tokens=50))
    capped.gconfig.max_tokens = len(capped.input_ids) + 3
    assert len((await engine.agenerate(capped)).output_tokens) == 3


async def test_image_data_path_equals_precomputed_tensors(
    kit: Any, engine: InProcessEngine
) -> None:
    gconfig = GenerationHyperparameters(max_new_tokens=12)
    pre = kit.vision_request(gconfig, seed=5)
    raw = kit.vision_request(gconfig, seed=5)
    raw.metadata.pop("multi_modal_input")
    a, b = await engine.agenerate(pre), await engine.agenerate(raw)
    assert a.output_tokens == b.output_tokens
    assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-5)
    assert b.input_images == raw.image_data


async def test_same_seed_same_output(kit: Any, engine: InProcessEngine) -> None:
    gconfig = GenerationHyperparameters(max_new_tokens=10)
    a = await engine.agenerate(kit.text_request(gconfig, seed=1))
    b = await engine.agenerate(kit.text_request(gconfig, seed=1))
    c = await engine.agenerate(kit.text_request(gconfig, seed=2))
    assert a.output_tokens == b.output_tokens != c.output_tokens


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_samples": 2}, "n_samples"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"use_beam_search": True}, "beam"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_tokens": 3}, "no room"),
    ],
)
async def test_unsupported_settings_raise(
    kit: Any, engine: InProcessEngine, change: dict[str, Any], message: str
) -> None:
    req = kit.text_request(GenerationHyperparameters(max_new_tokens=4).new(**change))
    with pytest.raises(ValueError, match=message):
        await engine.agenerate(req)


async def test_bad_inputs_raise_clear_errors(kit: Any, engine: InProcessEngine) -> None:
    gconfig = GenerationHyperparameters(max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        await engine.agenerate(ModelRequest(input_ids=[], gconfig=gconfig))
    no_pixels = kit.vision_request(gconfig)
    no_pixels.metadata.pop("multi_modal_input")
    no_pixels.image_data = []
    with pytest.raises(ValueError, match="placeholder"):
        await engine.agenerate(no_pixels)
    garbage = kit.vision_request(gconfig)
    garbage.metadata.pop("multi_modal_input")
    garbage.image_data = ["not base64 at all!"]
    with pytest.raises(ValueError, match="base64"):
        await engine.agenerate(garbage)
    wrong_size = kit.vision_request(gconfig)
    wrong_size.metadata.pop("multi_modal_input")
    wrong_size.image_data = [kit.b64_png(kit.screenshot(size=(400, 400)))]
    with pytest.raises(ValueError, match="placeholder tokens"):
        await engine.agenerate(wrong_size)
    # the engine still serves after bad requests
    assert len((await engine.agenerate(kit.text_request(gconfig))).output_tokens) == 4


def test_remote_only_features_raise_type_error(engine: InProcessEngine) -> None:
    with pytest.raises(TypeError, match="remote-engine"):
        engine.launch_server({})
    with pytest.raises(TypeError, match="remote-engine"):
        engine.update_weights_from_distributed(None, [])  # type: ignore[arg-type]


def _params(**kw: Any) -> SamplingParams:
    base = dict(
        greedy=False,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=8,
        min_new_tokens=0,
        stop_token_ids=frozenset({0}),
    )
    return SamplingParams(**{**base, **kw})


def test_sample_token_inverse_cdf_and_restrictions() -> None:
    logits = torch.tensor([0.0, 2.0, 1.0, -1.0])
    lp = torch.log_softmax(logits, -1)
    probs = lp.exp()
    # u just below the first bin's edge picks token 0, just above picks token 1
    assert sample_token(logits, _params(), 5, float(probs[0]) - 1e-6).token == 0
    assert sample_token(logits, _params(), 5, float(probs[0]) + 1e-6).token == 1
    assert sample_token(logits, _params(greedy=True), 5, 0.99).token == 1
    # top_k=1 always picks the argmax; reported logprob stays the full one
    picked = sample_token(logits, _params(top_k=1), 5, 0.0)
    assert picked.token == 1 and picked.logprob == pytest.approx(float(lp[1]))
    assert picked.truncated_logprob == pytest.approx(0.0)
    # min_new_tokens bans the stop token 0 even at u=0
    assert sample_token(logits, _params(min_new_tokens=3), 1, 0.0).token != 0
    # never_sample ids are never picked
    assert sample_token(logits, _params(greedy=True, never_sample=frozenset({1})), 0, 0).token == 2
    # temperature scales the reported logprob
    hot = sample_token(logits, _params(temperature=0.5, greedy=True), 5, 0.0)
    assert hot.logprob == pytest.approx(float(torch.log_softmax(logits / 0.5, -1)[1]))
    # top_p keeps the smallest head whose exclusive mass is below p
    p_sorted = probs.sort(descending=True).values
    cut = sample_token(logits, _params(top_p=float(p_sorted[0]) - 1e-3), 5, 0.999)
    assert cut.token == 1
