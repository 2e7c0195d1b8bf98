"""Core invariant: every returned logprob equals a plain forward pass over prompt + output."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_native.engine import InProcessEngine

CASES = [
    pytest.param(1.0, int(1e8), 1.0, id="T1"),
    pytest.param(0.7, int(1e8), 1.0, id="T0.7"),
    pytest.param(1.0, 20, 1.0, id="T1-topk20"),
    pytest.param(0.7, int(1e8), 0.9, id="T0.7-topp0.9"),
    pytest.param(1.3, 50, 0.8, id="T1.3-topk50-topp0.8"),
]


@pytest.mark.parametrize("with_image", [True, False], ids=["image", "text"])
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), CASES)
async def test_logprobs_match_one_forward_pass(
    kit: Any,
    engine: InProcessEngine,
    with_image: bool,
    temperature: float,
    top_k: int,
    top_p: float,
) -> None:
    gconfig = GenerationHyperparameters(
        max_new_tokens=24, temperature=temperature, top_k=top_k, top_p=top_p
    )
    build = kit.vision_request if with_image else kit.text_request
    for seed in range(3):
        req = build(gconfig, seed=seed)
        resp = await engine.agenerate(req)
        assert resp.input_tokens == req.input_ids
        assert len(resp.output_tokens) == len(resp.output_logprobs) == len(resp.output_versions)
        assert len(resp.output_tokens) > 0
        ref = kit.reference(req, resp.output_tokens, temperature)
        got = torch.tensor(resp.output_logprobs)
        assert torch.allclose(got, ref, atol=1e-4, rtol=0), (got - ref).abs().max()


async def test_batched_mixed_rows_are_exact(kit: Any) -> None:
    """Left-padded batches mixing image and text prompts of different lengths stay exact."""
    engine = kit.engine(max_batch_size=8)
    try:
        gconfig = GenerationHyperparameters(max_new_tokens=16, temperature=1.0)
        reqs = [
            kit.vision_request(gconfig, text="Open Settings"),
            kit.text_request(gconfig, text="Go home."),
            kit.vision_request(gconfig, text="Turn on Wi-Fi and then go back home please"),
            kit.text_request(gconfig, text="Create a note saying done. Open Contacts."),
        ]
        resps = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        for req, resp in zip(reqs, resps, strict=True):
            ref = kit.reference(req, resp.output_tokens, 1.0)
            assert torch.allclose(torch.tensor(resp.output_logprobs), ref, atol=1e-4, rtol=0)
    finally:
        engine.destroy()


async def test_truncated_mode_reports_renormalised_logprob(kit: Any) -> None:
    engine = kit.engine(logprob_mode="truncated")
    try:
        gconfig = GenerationHyperparameters(max_new_tokens=12, temperature=0.8, top_k=5)
        req = kit.text_request(gconfig, seed=3)
        resp = await engine.agenerate(req)
        full = kit.reference(req, resp.output_tokens, 0.8)
        got = torch.tensor(resp.output_logprobs)
        assert (got > full + 1e-3).all()  # renormalising over 5 tokens raises every logprob
        # recompute the truncated value from the full distribution at each position
        with torch.no_grad():
            ids = torch.tensor([req.input_ids + resp.output_tokens])
            kit.tiny.model.model.rope_deltas = None
            logits = kit.tiny.model(input_ids=ids).logits[0].float() / 0.8
        n = len(req.input_ids)
        for i, token in enumerate(resp.output_tokens):
            row = torch.log_softmax(logits[n - 1 + i], -1)
            top = torch.topk(row, 5).values
            expected = row[token] - torch.logsumexp(top, -1)
            assert abs(float(expected) - resp.output_logprobs[i]) < 1e-4
    finally:
        engine.destroy()
