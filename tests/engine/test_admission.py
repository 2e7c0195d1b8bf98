"""Admission of the slots decoder: the KV budget bounds the rows held, prefill is shortest
first, and both leave every log-prob exact."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_native.engine import InProcessEngineConfig
from cua_native.engine.kv_arena import KVArena, batch_bucket

FP32_TOLERANCE = 1e-5
BLOCK = 16


def _gconfig(n: int) -> GenerationHyperparameters:
    return GenerationHyperparameters(max_new_tokens=n, temperature=1.0, ignore_eos=True)


def _kv_bytes(kit: Any, rows: int, horizon: int) -> int:
    text = kit.tiny.model.config.text_config
    head_dim = getattr(text, "head_dim", text.hidden_size // text.num_attention_heads)
    per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * 4  # fp32
    length = horizon + (horizon // 8 if rows <= 8 else 0)
    return batch_bucket(rows) * (-(-length // BLOCK) * BLOCK) * per_token


async def test_kv_budget_bounds_the_rows_held_and_stays_exact(kit: Any) -> None:
    """A budget that holds two rows: four requests run two at a time (the decode step sees
    at most two rows), all finish, all exact against one forward pass."""
    new_tokens = 6
    reqs = [kit.text_request(_gconfig(new_tokens), text=f"Go home {i}.", seed=i) for i in range(4)]
    horizon = max(len(r.input_ids) for r in reqs) + new_tokens
    budget = _kv_bytes(kit, 2, horizon)
    assert budget < _kv_bytes(kit, 3, horizon)
    engine = kit.engine(max_batch_size=4, kv_block=BLOCK, kv_cache_gib=budget / 2**30)
    widths: list[int] = []
    head = engine.model.get_output_embeddings()
    head.register_forward_hook(lambda _m, args, _o: widths.append(args[0].shape[0]))
    try:
        engine.pause()
        tasks = [asyncio.ensure_future(engine.agenerate(r)) for r in reqs]
        for _ in range(6000):  # bounded polling: every request queued
            if engine.queued == len(reqs):
                break
            await asyncio.sleep(0.01)
        engine.resume()
        responses = await asyncio.gather(*tasks)
    finally:
        engine.destroy()
    assert max(widths) == 2  # decode steps (and prefills) never held more than two rows
    for req, resp in zip(reqs, responses, strict=True):
        assert len(resp.output_tokens) == new_tokens
        ref = kit.reference(req, resp.output_tokens, 1.0)
        assert (torch.tensor(resp.output_logprobs) - ref).abs().max() <= FP32_TOLERANCE


async def test_one_row_runs_even_past_the_budget(kit: Any) -> None:
    engine = kit.engine(kv_cache_gib=1e-9)
    try:
        req = kit.text_request(_gconfig(3), seed=1)
        resp = await asyncio.wait_for(engine.agenerate(req), timeout=120)
    finally:
        engine.destroy()
    assert len(resp.output_tokens) == 3


async def test_prefill_goes_shortest_first(kit: Any) -> None:
    """Released together, the shortest prompt is prefilled first (its first token comes
    first), whatever the arrival order."""
    engine = kit.engine(max_batch_size=3, prefill_tokens=1)  # one row per prefill
    lengths: list[int] = []
    engine.model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _o: lengths.append(args[0].shape[1]) if args[0].dim() == 3 else None
    )
    texts = ["Open Contacts, then add Alice with her phone number", "Go home.", "Open Settings"]
    reqs = [kit.text_request(_gconfig(2), text=t, seed=i) for i, t in enumerate(texts)]
    try:
        engine.pause()
        tasks = [asyncio.ensure_future(engine.agenerate(r)) for r in reqs]
        for _ in range(6000):
            if engine.queued == len(reqs):
                break
            await asyncio.sleep(0.01)
        lengths.clear()
        engine.resume()
        responses = await asyncio.gather(*tasks)
    finally:
        engine.destroy()
    prompt_lengths = sorted(len(r.input_ids) for r in reqs)
    assert len(set(prompt_lengths)) == 3
    firsts = sorted(responses, key=lambda r: r.ttft)
    assert [len(r.input_tokens) for r in firsts] == prompt_lengths


def test_arena_bytes_grow_from_the_present_arena() -> None:
    arena = KVArena(2, 2, 4, torch.float32, torch.device("cpu"), block=8)
    per_slot_position = 2 * 2 * 2 * 4 * 4  # keys and values, layers, heads, dim, fp32
    assert arena.bytes_for(3, 10) == batch_bucket(3) * 16 * per_slot_position
    arena.ensure(rows=8, length=40)
    assert arena.bytes_for(1, 10) == 8 * arena.capacity * per_slot_position  # never shrinks
    assert arena.bytes_for(1, 10, grown=False) == 16 * per_slot_position


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="kv_cache_gib"):
        InProcessEngineConfig(kv_cache_gib=0)
