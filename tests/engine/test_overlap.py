"""Overlapped decode (``engine/overlap.py``): the same results as the step-by-step loop.

The engine launches step ``t+1`` on step ``t``'s sampled tokens before the host reads them.
On CPU nothing runs asynchronously, so these tests check the bookkeeping: every row gets the
tokens, log-probs, versions and stop reasons the step-by-step loop gives it, rows joining
and leaving mid-run included, and a stopping row costs exactly one extra step.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_native.engine import InProcessEngine

FP32_TOLERANCE = 1e-5


def _requests(kit: Any) -> list[Any]:
    """Rows that stop at different steps, for different reasons, with every sampler kind:
    greedy, plain sampling, ``min_new_tokens``, a stop string, and top-k (which the batch
    cannot overlap while that row runs)."""
    g = GenerationHyperparameters
    return [
        kit.vision_request(g(max_new_tokens=9, temperature=1.0), seed=1),
        kit.text_request(g(max_new_tokens=3, greedy=True, ignore_eos=True), seed=2),
        kit.text_request(g(max_new_tokens=14, temperature=0.7, min_new_tokens=5), seed=3),
        kit.vision_request(g(max_new_tokens=6, temperature=1.0), text="Turn on Wi-Fi", seed=4),
        kit.text_request(g(max_new_tokens=12, temperature=1.0, stop=["a"]), seed=5),
        kit.text_request(g(max_new_tokens=5, temperature=1.0, top_k=5), text="Call Bob", seed=6),
        kit.text_request(g(max_new_tokens=1, temperature=1.0), text="Back", seed=7),
        kit.vision_request(g(max_new_tokens=16, greedy=True, ignore_eos=True), seed=8),
    ]


async def _run(kit: Any, overlap: bool, reqs: list[Any]) -> list[Any]:
    engine = kit.engine(max_batch_size=3, kv_block=4, overlap_decode=overlap)
    try:
        return list(await asyncio.gather(*(engine.agenerate(r) for r in reqs)))
    finally:
        engine.destroy()


async def test_overlapped_decode_gives_the_step_by_step_results(kit: Any) -> None:
    reqs = _requests(kit)
    plain = await _run(kit, False, reqs)
    overlapped = await _run(kit, True, reqs)
    for req, a, b in zip(reqs, plain, overlapped, strict=True):
        assert b.output_tokens == a.output_tokens
        assert b.output_versions == a.output_versions
        assert b.stop_reason == a.stop_reason
        # log-probs: each the one a plain forward gives (prefill groups may differ between
        # the runs, as rows leave at other moments, so float32 may differ in the last bits)
        temperature = req.gconfig.temperature if not req.gconfig.greedy else 1.0
        ref = kit.reference(req, b.output_tokens, temperature)
        assert (torch.tensor(b.output_logprobs) - ref).abs().max() <= FP32_TOLERANCE
        assert b.output_logprobs == pytest.approx(a.output_logprobs, abs=FP32_TOLERANCE)
    lengths = {len(r.output_tokens) for r in plain}
    assert len(lengths) > 3, lengths  # rows really did stop at different steps


async def test_a_stopping_row_costs_one_extra_step(kit: Any) -> None:
    """Overlap launches the step after a row's last token before reading that token: one
    row of ``n`` tokens takes a prefill and ``n`` decode steps, not ``n - 1``."""
    n = 7
    req = kit.text_request(
        GenerationHyperparameters(max_new_tokens=n, greedy=True, ignore_eos=True)
    )
    passes: dict[bool, int] = {}
    outputs: dict[bool, list[int]] = {}
    for overlap in (False, True):
        engine: InProcessEngine = kit.engine(overlap_decode=overlap)
        calls: list[int] = []
        engine.model.get_output_embeddings().register_forward_hook(
            lambda *_, calls=calls: calls.append(1)
        )
        try:
            outputs[overlap] = (await engine.agenerate(req)).output_tokens
        finally:
            engine.destroy()
        passes[overlap] = len(calls)
    assert outputs[True] == outputs[False]
    assert len(outputs[True]) == n
    assert passes == {False: n, True: n + 1}


async def test_a_weight_update_between_steps_reads_the_step_in_flight_first(kit: Any) -> None:
    """A weight update while rows decode: tokens before it carry the old version, tokens
    after it the new one, and each token's log-prob is the one its version's weights give
    (one plain forward per version)."""
    engine: InProcessEngine = kit.engine()
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()
    calls: list[int] = []

    def hook(*_: Any) -> None:
        calls.append(1)
        if len(calls) == 6:
            loop.call_soon_threadsafe(gate.set)

    engine.model.get_output_embeddings().register_forward_hook(hook)
    noise = torch.Generator().manual_seed(0)
    new_weights = {
        name: tensor + 0.01 * torch.randn(tensor.shape, generator=noise)
        for name, tensor in kit.tiny.model.state_dict().items()
        if name.endswith(("mlp.down_proj.weight", "self_attn.k_proj.weight", "mlp.up_proj.weight"))
    }
    try:
        req = kit.text_request(
            GenerationHyperparameters(max_new_tokens=24, greedy=True, ignore_eos=True), seed=9
        )
        task = asyncio.ensure_future(engine.agenerate(req))
        await gate.wait()
        await asyncio.to_thread(
            lambda: engine.update_weights_from_state_dict(new_weights, version=1).result(60)
        )
        resp = await task
    finally:
        engine.destroy()
    versions = resp.output_versions
    assert versions[0] == 0 and versions[-1] == 1
    assert versions == sorted(versions)
    updated = _with(kit.tiny.model, new_weights)
    split = versions.index(1)
    tokens = resp.output_tokens
    got = torch.tensor(resp.output_logprobs)
    old = kit.reference(req, tokens, 1.0)
    new = kit.reference(req, tokens, 1.0, model=updated)
    assert (got[:split] - old[:split]).abs().max() <= 1e-5
    assert (got[split:] - new[split:]).abs().max() <= 1e-5


def _with(model: Any, weights: dict[str, torch.Tensor]) -> Any:
    updated = copy.deepcopy(model)
    updated.load_state_dict(weights, strict=False)
    return updated
