"""Stacked projections (``engine/stacked_weights.py``): one product, each source's output."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_native.engine.stacked_weights import StackedLinear

FP32_TOLERANCE = 1e-5


@pytest.mark.parametrize("bias", [False, True])
def test_a_stack_returns_each_sources_output(bias: bool) -> None:
    torch.manual_seed(0)
    sources = [torch.nn.Linear(32, n, bias=bias) for n in (16, 8, 8)]
    stack = StackedLinear(sources)
    x = torch.randn(3, 32)
    for got, source in zip(stack(x), sources, strict=True):
        assert (got - source(x)).abs().max() <= 1e-6
    with torch.no_grad():  # a weight update in place, then the refresh
        for source in sources:
            source.weight.mul_(2.0)
    assert (stack(x)[1] - sources[1](x)).abs().max() > 1e-3  # stale until refreshed
    stack.refresh()
    for got, source in zip(stack(x), sources, strict=True):
        assert (got - source(x)).abs().max() <= 1e-6


def test_what_cannot_be_stacked_is_refused() -> None:
    assert StackedLinear.of(torch.nn.Linear(4, 4), torch.nn.Linear(5, 4)) is None
    assert StackedLinear.of(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, bias=False)) is None
    assert StackedLinear.of(torch.nn.Linear(4, 4), torch.nn.Identity()) is None
    with pytest.raises(ValueError, match="at least two"):
        StackedLinear([torch.nn.Linear(4, 4)])


async def test_the_engine_samples_the_same_with_and_without_stacking(kit: Any) -> None:
    g = GenerationHyperparameters
    reqs = [
        kit.vision_request(g(max_new_tokens=12, temperature=1.0), seed=1),
        kit.text_request(g(max_new_tokens=12, greedy=True, ignore_eos=True), seed=2),
    ]
    outputs = {}
    for stacked in (False, True):
        engine = kit.engine(stack_projections=stacked, max_batch_size=2)
        try:
            outputs[stacked] = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        finally:
            engine.destroy()
    for req, plain, stacked in zip(reqs, outputs[False], outputs[True], strict=True):
        assert stacked.output_tokens == plain.output_tokens
        temperature = 1.0
        ref = kit.reference(req, stacked.output_tokens, temperature)
        assert (torch.tensor(stacked.output_logprobs) - ref).abs().max() <= FP32_TOLERANCE
