"""``InProcessEngine.abort_requests``: the hook the stand-in server's pause is built on."""

from __future__ import annotations

import asyncio
from typing import Any

from areal.api.cli_args import GenerationHyperparameters

GCONFIG = GenerationHyperparameters(max_new_tokens=24, greedy=True, ignore_eos=True)


async def test_abort_ends_running_request_with_its_partial_output(kit: Any, sk: Any) -> None:
    reference = kit.engine()
    engine = kit.engine()
    gate = sk.ForwardGate(engine.model, at=5)
    try:
        full = await reference.agenerate(kit.vision_request(GCONFIG))
        task = asyncio.create_task(engine.agenerate(kit.vision_request(GCONFIG)))
        await gate.wait_blocked()  # five tokens sampled, the sixth forward pass in progress
        engine.abort_requests()
        gate.release()
        partial = await task
        assert partial.stop_reason == "abort"
        assert partial.output_tokens == full.output_tokens[:6]
        assert partial.output_logprobs == full.output_logprobs[:6]
        assert len(partial.output_versions) == 6
        after = await engine.agenerate(kit.vision_request(GCONFIG))  # the engine goes on
        assert after.output_tokens == full.output_tokens
    finally:
        gate.close()
        reference.destroy()
        engine.destroy()


async def test_abort_with_nothing_running_does_not_touch_later_requests(kit: Any) -> None:
    engine = kit.engine()
    try:
        engine.abort_requests()
        out = await engine.agenerate(kit.text_request(GCONFIG))
        assert out.stop_reason == "length"
        assert len(out.output_tokens) == GCONFIG.max_new_tokens
    finally:
        engine.destroy()


async def test_abort_while_paused_ends_held_requests(kit: Any, sk: Any) -> None:
    """Paused: the running request is held at a step boundary; abort ends it there."""
    engine = kit.engine()
    gate = sk.ForwardGate(engine.model, at=3)
    try:
        task = asyncio.create_task(engine.agenerate(kit.text_request(GCONFIG)))
        await gate.wait_blocked()
        engine.pause_generation()
        engine.abort_requests()
        gate.release()
        out = await task
        assert out.stop_reason == "abort"
        assert len(out.output_tokens) == 4
        engine.continue_generation()
        again = await engine.agenerate(kit.text_request(GCONFIG))
        assert again.stop_reason == "length"
    finally:
        gate.close()
        engine.destroy()
