"""The slots decoder: continuous batching over the slot KV cache, exact against one forward."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters
from transformers import LlamaConfig, LlamaForCausalLM

from cua_native.engine import InProcessEngine, InProcessEngineConfig
from cua_native.engine.kv_arena import KVArena, batch_bucket
from cua_native.engine.text_step import unsupported_reason

FP32_TOLERANCE = 1e-5


def _gconfig(n: int, **kw: Any) -> GenerationHyperparameters:
    return GenerationHyperparameters(max_new_tokens=n, temperature=kw.pop("temperature", 1.0), **kw)


def _assert_exact(kit: Any, req: Any, resp: Any, temperature: float = 1.0) -> None:
    ref = kit.reference(req, resp.output_tokens, temperature)
    got = torch.tensor(resp.output_logprobs)
    assert (got - ref).abs().max() <= FP32_TOLERANCE, (got - ref).abs().max()


def test_tiny_qwen3_vl_uses_slots_and_other_models_fall_back(kit: Any) -> None:
    engine = kit.engine()
    try:
        assert engine.decoder_kind == "slots"
    finally:
        engine.destroy()
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    assert "llama" in (unsupported_reason(llama) or "")
    assert InProcessEngine(llama).decoder_kind == "legacy"
    with pytest.raises(ValueError, match="not available"):
        InProcessEngine(llama, config=InProcessEngineConfig(decoder="slots"))


@pytest.mark.parametrize("decoder", ["slots", "legacy"])
async def test_rows_join_a_running_batch_and_stay_exact(kit: Any, decoder: str) -> None:
    """Requests arriving mid-decode join at a step boundary and finish before the running
    one (slots) rather than after it (legacy: static batches); tiny capacity blocks make the
    arena grow many times while rows run; every logprob matches one plain forward in fp32."""
    engine = kit.engine(max_batch_size=4, kv_block=4, decoder=decoder)
    loop = asyncio.get_running_loop()
    done_at: dict[int, float] = {}

    def track(i: int, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda _: done_at.setdefault(i, loop.time()))
        return task

    decoding, release = threading.Event(), threading.Event()
    steps: list[int] = []

    def count(*_: Any) -> None:  # hold the worker inside the first request's 3rd pass
        steps.append(1)
        if len(steps) == 3:
            decoding.set()
            release.wait(60)

    def queued(n: int) -> bool:  # bounded polling off the event loop
        for _ in range(6000):
            if engine.queued == n:
                return True
            time.sleep(0.01)
        return False

    engine.model.get_output_embeddings().register_forward_hook(count)
    try:
        first = kit.vision_request(_gconfig(64, ignore_eos=True), seed=1)
        first_task = track(0, engine.agenerate(first))
        # wait until the first request is being decoded
        assert await asyncio.to_thread(decoding.wait, 60)
        late = [
            kit.text_request(_gconfig(6, temperature=0.7), text="Go home.", seed=2),
            kit.vision_request(_gconfig(6, top_k=7), text="Turn on Wi-Fi", seed=3),
            kit.text_request(_gconfig(6, top_p=0.9), text="Open Contacts and add Alice", seed=4),
        ]
        late_tasks = [track(i + 1, engine.agenerate(r)) for i, r in enumerate(late)]
        assert await asyncio.to_thread(queued, len(late))
        release.set()
        late_resps = await asyncio.gather(*late_tasks)
        first_resp = await first_task
        assert len(first_resp.output_tokens) == 64
        ended_first = min(done_at[i] for i in (1, 2, 3)) < done_at[0]
        assert ended_first == (decoder == "slots")
        _assert_exact(kit, first, first_resp)
        for req, resp in zip(late, late_resps, strict=True):
            _assert_exact(kit, req, resp, req.gconfig.temperature)
    finally:
        release.set()
        engine.destroy()


async def test_slots_and_legacy_sample_the_same_tokens(kit: Any) -> None:
    gconfig = _gconfig(16)
    reqs = [
        kit.vision_request(gconfig, seed=11),
        kit.text_request(gconfig, text="Set brightness to 80%.", seed=12),
        kit.vision_request(gconfig, text="Open Settings then Wi-Fi", seed=13),
    ]
    outputs = {}
    for decoder in ("slots", "legacy"):
        engine = kit.engine(decoder=decoder, max_batch_size=2)
        try:
            outputs[decoder] = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        finally:
            engine.destroy()
    for a, b in zip(outputs["slots"], outputs["legacy"], strict=True):
        assert a.output_tokens == b.output_tokens
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=FP32_TOLERANCE)


@pytest.mark.parametrize("tokens_first", [False, True])
def test_arena_grows_in_buckets_and_keeps_contents(tokens_first: bool) -> None:
    arena = KVArena(
        layers=2,
        kv_heads=2,
        head_dim=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
        block=8,
        tokens_first=tokens_first,
    )
    assert arena.ensure(rows=1, length=5)
    assert (arena.slots, arena.capacity) == (1, 8)
    keys = torch.randn(2, 5, 4)
    arena.write(0, 1, keys, -keys)
    generation = arena.generation
    assert not arena.ensure(rows=1, length=8)
    assert arena.ensure(rows=3, length=20)
    assert arena.generation > generation
    assert (arena.slots, arena.capacity) == (batch_bucket(3), 24)

    def row(tensor: torch.Tensor, slot: int) -> torch.Tensor:  # [kv_heads, n, head_dim]
        return tensor[slot, :5].transpose(0, 1) if tokens_first else tensor[slot, :, :5]

    assert torch.equal(row(arena.keys[1], 0), keys)
    assert torch.equal(row(arena.values[1], 0), -keys)
    arena.move(0, 2, 5)
    assert torch.equal(row(arena.keys[1], 2), keys)
    arena.fit(rows=1, length=5)  # idle: a much smaller batch shrinks the arena
    assert (arena.slots, arena.capacity) == (1, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
async def test_cuda_graphs_stay_valid_across_weight_updates(kit: Any) -> None:
    model = copy.deepcopy(kit.tiny.model)
    engine = InProcessEngine(
        model, kit.tiny.processor, config=InProcessEngineConfig(device="cuda", max_batch_size=4)
    )
    engine.initialize()
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        reqs = [kit.vision_request(_gconfig(24, ignore_eos=True), seed=s) for s in range(3)]
        await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        update = {k: v * 1.01 for k, v in kit.tiny.model.state_dict().items() if "mlp" in k}
        await asyncio.wrap_future(engine.update_weights_from_state_dict(update, version=1))
        resps = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        new_model = copy.deepcopy(kit.tiny.model)
        new_model.load_state_dict(update, strict=False)
        for req, resp in zip(reqs, resps, strict=True):
            assert set(resp.output_versions) == {1}
            ref = kit.reference(req, resp.output_tokens, 1.0, model=new_model)
            assert (torch.tensor(resp.output_logprobs) - ref).abs().max() <= 1e-4
    finally:
        engine.destroy()
