"""Batching, determinism under concurrency, cancellation and event-loop responsiveness."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from areal.api.cli_args import GenerationHyperparameters


def _requests(kit: Any, n: int, max_new_tokens: int = 12) -> list[Any]:
    gconfig = GenerationHyperparameters(max_new_tokens=max_new_tokens, temperature=1.0)
    texts = ["Go home.", "Open Contacts and add Alice", "Set brightness to 80%."]
    return [
        (kit.vision_request if i % 2 else kit.text_request)(gconfig, text=texts[i % 3])
        for i in range(n)
    ]


async def test_concurrent_equals_sequential(kit: Any) -> None:
    sequential = kit.engine(seed=7, max_batch_size=1)
    concurrent = kit.engine(seed=7, max_batch_size=8)
    try:
        seq = [await sequential.agenerate(r) for r in _requests(kit, 16)]
        con = await asyncio.gather(*(concurrent.agenerate(r) for r in _requests(kit, 16)))
        for a, b in zip(seq, con, strict=True):
            assert a.output_tokens == b.output_tokens
            assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-4)
        assert len({tuple(r.output_tokens) for r in seq}) > 1  # seeds differ per request
    finally:
        sequential.destroy()
        concurrent.destroy()


async def test_cancelled_caller_does_not_break_others(kit: Any) -> None:
    reference = kit.engine(seed=3)
    engine = kit.engine(seed=3)
    try:
        expected = [await reference.agenerate(r) for r in _requests(kit, 4, 40)]
        tasks = [asyncio.create_task(engine.agenerate(r)) for r in _requests(kit, 4, 40)]
        await asyncio.sleep(0.02)
        tasks[1].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        for i in (0, 2, 3):
            assert results[i].output_tokens == expected[i].output_tokens
        after = await engine.agenerate(_requests(kit, 1)[0])
        assert after.stop_reason == "length"
    finally:
        reference.destroy()
        engine.destroy()


async def test_event_loop_stays_responsive(kit: Any) -> None:
    engine = kit.engine(max_batch_size=4)
    gaps: list[float] = []
    stop = asyncio.Event()
    loop_thread = threading.get_ident()
    on_loop: list[int] = []
    engine.model.get_output_embeddings().register_forward_hook(
        lambda *_: on_loop.append(1) if threading.get_ident() == loop_thread else None
    )

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    try:
        tick = asyncio.create_task(ticker())
        await asyncio.gather(*(engine.agenerate(r) for r in _requests(kit, 8, 120)))
        stop.set()
        await tick
        assert len(gaps) >= 3  # it ticked while the engine worked
        assert not on_loop  # no forward pass ever ran on the event loop's thread
    finally:
        engine.destroy()


async def test_destroy_aborts_and_refuses(kit: Any) -> None:
    engine = kit.engine()
    task = asyncio.create_task(engine.agenerate(_requests(kit, 1, 100000)[0]))
    await asyncio.sleep(0.05)
    await asyncio.to_thread(engine.destroy)
    resp = await task
    assert resp.stop_reason == "abort"
    assert len(resp.output_tokens) == len(resp.output_logprobs) == len(resp.output_versions)
    with pytest.raises(RuntimeError, match="initialize"):
        await engine.agenerate(_requests(kit, 1)[0])
